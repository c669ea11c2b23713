// Command netpolcheck evaluates Kubernetes NetworkPolicies with a maintained engine: cyclonus'
// matcher (github.com/mattfenwick/cyclonus/pkg/matcher), the evaluator the Kubernetes
// network-policy-api project's policy-assistant grew from. No rule of NetworkPolicy's semantics is
// written here: policies are decoded into k8s.io/api's own types and every verdict is the matcher's.
//
// stdin: {"policies": [NetworkPolicy, ...], "namespaces": [{"name", "labels"}, ...],
//
//	"queries": [{"source": {"namespace", "podLabels", "ip"}, "destination": {...},
//	             "port": 8000, "portName": "http", "protocol": "TCP"}, ...]}
//
// The policies are the objects as the API returns them; a peer's namespace labels are looked up in
// "namespaces" by name (a namespace not listed has no labels, not even kubernetes.io/metadata.name).
// stdout: one JSON object per query, one a line, in order: {"allowed", "ingress", "egress",
// "ingressAllowedBy", "ingressDeniedBy"}: the verdict, each direction's, and the policies (namespace
// and pod selector of each target) that allowed or refused the traffic on ingress.
//
// Built by scripts/install.sh; run by tests/unit/test_netpol.py and tests/integration/test_netpol.py.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/mattfenwick/cyclonus/pkg/matcher"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

type namespace struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

type peer struct {
	Namespace string            `json:"namespace"`
	PodLabels map[string]string `json:"podLabels"`
	IP        string            `json:"ip"`
}

type query struct {
	Source      peer   `json:"source"`
	Destination peer   `json:"destination"`
	Port        int    `json:"port"`
	PortName    string `json:"portName"`
	Protocol    string `json:"protocol"`
}

type input struct {
	Policies   []*networkingv1.NetworkPolicy `json:"policies"`
	Namespaces []namespace                   `json:"namespaces"`
	Queries    []query                       `json:"queries"`
}

type verdict struct {
	Allowed          bool     `json:"allowed"`
	Ingress          bool     `json:"ingress"`
	Egress           bool     `json:"egress"`
	IngressAllowedBy []string `json:"ingressAllowedBy"`
	IngressDeniedBy  []string `json:"ingressDeniedBy"`
}

func targets(found []*matcher.Target) []string {
	keys := []string{}
	for _, target := range found {
		keys = append(keys, target.GetPrimaryKey())
	}
	return keys
}

func main() {
	var in input
	decoder := json.NewDecoder(os.Stdin)
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&in); err != nil {
		fmt.Fprintf(os.Stderr, "netpolcheck: bad input: %v\n", err)
		os.Exit(2)
	}
	labels := map[string]map[string]string{}
	for _, ns := range in.Namespaces {
		labels[ns.Name] = ns.Labels
	}
	trafficPeer := func(p peer) *matcher.TrafficPeer {
		return &matcher.TrafficPeer{
			Internal: &matcher.InternalPeer{PodLabels: p.PodLabels, NamespaceLabels: labels[p.Namespace], Namespace: p.Namespace},
			IP:       p.IP,
		}
	}
	policy := matcher.BuildNetworkPolicies(true, in.Policies)
	out := json.NewEncoder(os.Stdout)
	for _, q := range in.Queries {
		protocol := v1.Protocol(q.Protocol)
		if protocol == "" {
			protocol = v1.ProtocolTCP
		}
		result := policy.IsTrafficAllowed(&matcher.Traffic{
			Source:           trafficPeer(q.Source),
			Destination:      trafficPeer(q.Destination),
			ResolvedPort:     q.Port,
			ResolvedPortName: q.PortName,
			Protocol:         protocol,
		})
		if err := out.Encode(verdict{
			Allowed:          result.IsAllowed(),
			Ingress:          result.Ingress.IsAllowed(),
			Egress:           result.Egress.IsAllowed(),
			IngressAllowedBy: targets(result.Ingress.AllowingTargets),
			IngressDeniedBy:  targets(result.Ingress.DenyingTargets),
		}); err != nil {
			fmt.Fprintf(os.Stderr, "netpolcheck: %v\n", err)
			os.Exit(1)
		}
	}
}
