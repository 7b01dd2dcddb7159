package check

import (
	"log/slog"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// rulefmtParse reads alerts.yaml with Prometheus' own rule file parser, as
// prometheus and promtool check rules do: unknown fields are errors, every
// expression and template is checked.
func rulefmtParse(t *testing.T, p parser.Parser) (*rulefmt.RuleGroups, []error) {
	t.Helper()
	return rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
}

// TestRuleParserIsStrict shows that the parser catches what it should.
func TestRuleParserIsStrict(t *testing.T) {
	t.Parallel()
	p := parser.NewParser(parser.Options{})
	for name, text := range map[string]string{
		"unknown field": "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n        fore: 5m\n",
		"bad PromQL":    "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rate(up[5m]\n",
		"bad template":  "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n        annotations:\n          summary: \"{{ $labels.x \"\n",
	} {
		if _, errs := rulefmt.Parse([]byte(text), false, model.UTF8Validation, p, slog.New(slog.DiscardHandler)); len(errs) == 0 {
			t.Errorf("%s: parsed without error", name)
		}
	}
}
