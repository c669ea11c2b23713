// Grafana dashboard JSON checked against Grafana's own dashboard model: the Grafana Foundation SDK's
// types are generated from Grafana's schemas (dashboard v1 and each panel plugin's options), and its
// strict unmarshalling refuses unknown fields and wrong types. Built by scripts/install.sh; run by
// tests/unit/test_chart.py.
module fleetpilot.dev/dashboardcheck

go 1.21

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
