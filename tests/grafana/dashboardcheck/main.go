// Command dashboardcheck validates Grafana dashboard JSON files against the dashboard model.
//
// Usage: dashboardcheck FILE...; prints one JSON object per file, {"file", "errors": [...]}, and
// exits 1 when any file has an error.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

type report struct {
	File   string   `json:"file"`
	Panels int      `json:"panels"`
	Errors []string `json:"errors"`
}

// failed: the SDK returns its error list as an error even when the list is empty.
func failed(err error) bool {
	var list cog.BuildErrors
	if errors.As(err, &list) {
		return len(list) > 0
	}
	return err != nil
}

func check(path string) report {
	out := report{File: path, Errors: []string{}}
	raw, err := os.ReadFile(path)
	if err != nil {
		out.Errors = append(out.Errors, err.Error())
		return out
	}
	var model dashboard.Dashboard
	// Strict: unknown fields, wrong types and missing required fields are errors, in the dashboard,
	// its panels (each panel type's own options and field config) and their Prometheus queries.
	if err := model.UnmarshalJSONStrict(raw); failed(err) {
		out.Errors = append(out.Errors, err.Error())
		return out
	}
	if err := model.Validate(); failed(err) {
		out.Errors = append(out.Errors, err.Error())
	}
	out.Panels = len(model.Panels)
	return out
}

func main() {
	plugins.RegisterDefaultPlugins()
	failed := false
	encoder := json.NewEncoder(os.Stdout)
	for _, path := range os.Args[1:] {
		result := check(path)
		failed = failed || len(result.Errors) > 0
		if err := encoder.Encode(result); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if failed {
		os.Exit(1)
	}
}
