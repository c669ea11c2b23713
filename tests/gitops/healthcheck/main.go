// Command gitops-healthcheck evaluates objects' health the way Argo CD and kstatus do, with their code.
//
// stdin: {"argocdConfigMap": {"data": {...}}, "objects": [obj, ...]} — the argocd-cm data holding the
// resource.customizations.health.<group>_<kind> Lua script, and the objects to judge.
// stdout: one JSON array, per object {"argocd": {"status", "message"}, "kstatus": {"status", "message"}}.
//
// Argo CD reads each `resource.customizations.health.<group>_<kind>` key of argocd-cm as the health
// override of group/kind; that key mapping is redone here (its settings package is a large import
// for one string rule), and the script then runs through Argo CD's own util/lua.ResourceHealthOverrides,
// the call its controller makes for each live resource.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	appv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	argolua "github.com/argoproj/argo-cd/v3/util/lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

const healthPrefix = "resource.customizations.health."

type input struct {
	ArgocdConfigMap struct {
		Data map[string]string `json:"data"`
	} `json:"argocdConfigMap"`
	// Raw, decoded as client-go decodes API objects (integers stay int64, as kstatus requires).
	Objects []json.RawMessage `json:"objects"`
}

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Error   string `json:"error,omitempty"`
}

type output struct {
	Argocd  verdict `json:"argocd"`
	Kstatus verdict `json:"kstatus"`
}

func overrides(data map[string]string) argolua.ResourceHealthOverrides {
	found := argolua.ResourceHealthOverrides{}
	for key, script := range data {
		if !strings.HasPrefix(key, healthPrefix) {
			continue
		}
		// "<group>_<kind>": the group may hold dots, the kind never an underscore.
		groupKind := strings.TrimPrefix(key, healthPrefix)
		cut := strings.LastIndex(groupKind, "_")
		if cut < 0 {
			continue
		}
		found[groupKind[:cut]+"/"+groupKind[cut+1:]] = appv1.ResourceOverride{HealthLua: script}
	}
	return found
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "gitops-healthcheck: bad input:", err)
		os.Exit(2)
	}
	health := overrides(in.ArgocdConfigMap.Data)
	if len(health) == 0 {
		fmt.Fprintln(os.Stderr, "gitops-healthcheck: no", healthPrefix+"* key in the ConfigMap")
		os.Exit(2)
	}
	results := make([]output, 0, len(in.Objects))
	for _, raw := range in.Objects {
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(raw); err != nil {
			fmt.Fprintln(os.Stderr, "gitops-healthcheck: bad object:", err)
			os.Exit(2)
		}
		var out output
		if argo, err := health.GetResourceHealth(obj); err != nil {
			out.Argocd.Error = err.Error()
		} else if argo == nil {
			out.Argocd.Error = "no health script applies to " + obj.GroupVersionKind().String()
		} else {
			out.Argocd = verdict{Status: string(argo.Status), Message: argo.Message}
		}
		if computed, err := status.Compute(obj); err != nil {
			out.Kstatus.Error = err.Error()
		} else {
			out.Kstatus = verdict{Status: computed.Status.String(), Message: computed.Message}
		}
		results = append(results, out)
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, "gitops-healthcheck:", err)
		os.Exit(1)
	}
}
