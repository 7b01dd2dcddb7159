package check

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
)

// A fleet of two processes, a and b, sampled every minute for 90 minutes,
// in good health: steady work, no errors, a steady backlog; of the six rows
// running in the database, four are in busy slots and two are done, their
// outcomes waiting to be recorded. Each value is promqltest's expanding
// notation (start+step x count).
var healthyFleet = map[string]string{
	`pgworker_queue_running_rows{instance="a",queue="default"}`:               "6x90",
	`pgworker_queue_running_rows{instance="b",queue="default"}`:               "6x90",
	`pgworker_queue_pending_rows{instance="a",queue="default"}`:               "100x90",
	`pgworker_queue_pending_rows{instance="b",queue="default"}`:               "100x90",
	`pgworker_queue_paused{instance="a",queue="default"}`:                     "0x90",
	`pgworker_queue_paused{instance="b",queue="default"}`:                     "0x90",
	`pgworker_queue_oldest_pending_age_seconds{instance="a",queue="default"}`: "60x90",
	`pgworker_queue_oldest_pending_age_seconds{instance="b",queue="default"}`: "60x90",
	`pgworker_queue_stats_age_seconds{instance="a"}`:                          "5x90",
	`pgworker_queue_stats_age_seconds{instance="b"}`:                          "5x90",
	`pgworker_slots_busy{instance="a"}`:                                       "2x90",
	`pgworker_slots_busy{instance="b"}`:                                       "2x90",
	`pgworker_outcomes_unrecorded{instance="a"}`:                              "1x90",
	`pgworker_outcomes_unrecorded{instance="b"}`:                              "1x90",
	`pgworker_outcome_waits_total{instance="a"}`:                              "0x90",
	`pgworker_rows_done_total{instance="a",queue="default"}`:                  "0+10x90",
	`pgworker_rows_done_total{instance="b",queue="default"}`:                  "0+10x90",
	`pgworker_rows_failed_total{instance="a",queue="default",final="false"}`:  "0+0x90",
	`pgworker_rows_failed_total{instance="a",queue="default",final="true"}`:   "0+0x90",
	`pgworker_listener_up{instance="a"}`:                                      "1x90",
	`pgworker_listener_up{instance="b"}`:                                      "1x90",
	`pgworker_claim_errors_total{instance="a"}`:                               "0x90",
	`pgworker_heartbeat_errors_total{instance="a"}`:                           "0x90",
	`pgworker_reaped_rows_total{instance="a"}`:                                "0x90",
	`pgworker_lease_losses_total{instance="a"}`:                               "0x90",
}

// trouble is, for each alert, what goes wrong in the healthy fleet to make
// it fire, and (quiet) a variation that must not.
var trouble = map[string]struct{ fire, quiet map[string]string }{
	"PgworkerSilentWorkersHoldRows": {
		fire: map[string]string{
			`pgworker_queue_running_rows{instance="a",queue="default"}`: "8x90",
			`pgworker_queue_running_rows{instance="b",queue="default"}`: "8x90",
		},
		// Held for less than the alert's 10 minutes: a scrape out of step.
		quiet: map[string]string{`pgworker_queue_running_rows{instance="a",queue="default"}`: "6x84 8x5"},
	},
	"PgworkerRowsReaped": {
		fire: map[string]string{`pgworker_reaped_rows_total{instance="a"}`: "0x80 0+1x10"},
	},
	"PgworkerQueueFailureRate": {
		fire: map[string]string{`pgworker_rows_failed_total{instance="a",queue="default",final="false"}`: "0+5x90"},
		// One failure in a hundred.
		quiet: map[string]string{`pgworker_rows_failed_total{instance="a",queue="default",final="false"}`: "0+0.2x90"},
	},
	"PgworkerRowsFailedForGood": {
		fire: map[string]string{`pgworker_rows_failed_total{instance="a",queue="default",final="true"}`: "0x80 0+1x10"},
	},
	"PgworkerBacklogGrowing": {
		fire: map[string]string{
			`pgworker_queue_pending_rows{instance="a",queue="default"}`: "100+5x90",
			`pgworker_queue_pending_rows{instance="b",queue="default"}`: "100+5x90",
		},
		// Growing, but the queue is paused: the rows wait on purpose.
		quiet: map[string]string{
			`pgworker_queue_pending_rows{instance="a",queue="default"}`: "100+5x90",
			`pgworker_queue_paused{instance="a",queue="default"}`:       "1x90",
			`pgworker_queue_paused{instance="b",queue="default"}`:       "1x90",
		},
	},
	"PgworkerOldestPendingTooOld": {
		fire: map[string]string{`pgworker_queue_oldest_pending_age_seconds{instance="a",queue="default"}`: "3000+60x90"},
		quiet: map[string]string{
			`pgworker_queue_oldest_pending_age_seconds{instance="a",queue="default"}`: "3000+60x90",
			`pgworker_queue_paused{instance="a",queue="default"}`:                     "1x90",
			`pgworker_queue_paused{instance="b",queue="default"}`:                     "1x90",
		},
	},
	"PgworkerListenerDown": {
		fire: map[string]string{`pgworker_listener_up{instance="b"}`: "1x80 0x10"},
		// Down for the last three minutes: a reconnect may take that long.
		quiet: map[string]string{`pgworker_listener_up{instance="b"}`: "1x86 0x3"},
	},
	"PgworkerClaimErrors": {
		fire: map[string]string{`pgworker_claim_errors_total{instance="a"}`: "0x70 0+3x20"},
	},
	"PgworkerHeartbeatErrors": {
		fire: map[string]string{`pgworker_heartbeat_errors_total{instance="a"}`: "0x80 0+12x10"},
	},
	"PgworkerOutcomesWaitForTheDatabase": {
		fire: map[string]string{`pgworker_outcome_waits_total{instance="a"}`: "0x60 0+5x30"},
		// A failover: the slots wait for three minutes, then no more.
		quiet: map[string]string{`pgworker_outcome_waits_total{instance="a"}`: "0x70 0+20x3 60x16"},
	},
	"PgworkerLeasesLost": {
		fire: map[string]string{`pgworker_lease_losses_total{instance="a"}`: "0x85 1x5"},
	},
	"PgworkerQueueStatsStale": {
		fire: map[string]string{
			`pgworker_queue_stats_age_seconds{instance="a"}`: "5x60 60+60x30",
			`pgworker_queue_stats_age_seconds{instance="b"}`: "5x60 60+60x30",
		},
		// One process still reads the hint.
		quiet: map[string]string{`pgworker_queue_stats_age_seconds{instance="a"}`: "5x60 60+60x30"},
	},
}

func loadScript(overrides map[string]string) string {
	series := map[string]string{}
	for k, v := range healthyFleet {
		series[k] = v
	}
	for k, v := range overrides {
		if v == "" { // a series the processes do not export
			delete(series, k)
			continue
		}
		series[k] = v
	}
	var keys []string
	for k := range series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("load 1m\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s %s\n", k, series[k])
	}
	return b.String()
}

// firing evaluates an alert as Prometheus would at the end of the data,
// once a minute: it fires when its expression has had a result at every
// evaluation for its whole for: duration.
func firing(t *testing.T, engine *promql.Engine, script, expr string, hold time.Duration) bool {
	t.Helper()
	st := promqltest.LoadedStorage(t, script)
	end := time.Unix(0, 0).Add(89 * time.Minute)
	q, err := engine.NewRangeQuery(context.Background(), st, nil, expr, end.Add(-hold), end, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res := q.Exec(context.Background())
	if res.Err != nil {
		t.Fatalf("%s: %v", expr, res.Err)
	}
	m, err := res.Matrix()
	if err != nil {
		t.Fatal(err)
	}
	steps := int(hold/time.Minute) + 1
	for _, s := range m {
		if len(s.Floats) == steps {
			return true
		}
	}
	return false
}

// rulesToEvaluate reads alerts.yaml strictly and makes an engine to
// evaluate its rules.
func rulesToEvaluate(t *testing.T) (*rulefmt.RuleGroups, *promql.Engine) {
	t.Helper()
	groups, errs := rulefmtParse(t, parser.NewParser(parser.Options{}))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return groups, promqltest.NewTestEngine(t, false, 0, 1_000_000)
}

// TestAlertsFire evaluates every rule of alerts.yaml with Prometheus' PromQL
// engine on a healthy fleet (no alert fires) and on the trouble each one
// is for (it fires, and its quiet variation does not).
func TestAlertsFire(t *testing.T) {
	t.Parallel()
	groups, engine := rulesToEvaluate(t)
	healthy := loadScript(nil)
	seen := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			seen[r.Alert] = true
			hold := time.Duration(r.For)
			t.Run(r.Alert, func(t *testing.T) {
				if firing(t, engine, healthy, r.Expr, hold) {
					t.Error("fires on a healthy fleet")
				}
				tr, ok := trouble[r.Alert]
				if !ok {
					t.Fatal("no trouble scenario for this alert in rules_eval_test.go: add one")
				}
				if !firing(t, engine, loadScript(tr.fire), r.Expr, hold) {
					t.Errorf("does not fire on its trouble: %v", tr.fire)
				}
				if tr.quiet != nil && firing(t, engine, loadScript(tr.quiet), r.Expr, hold) {
					t.Errorf("fires on %v, which it should let pass", tr.quiet)
				}
			})
		}
	}
	for name := range trouble {
		if !seen[name] {
			t.Errorf("a trouble scenario for %s, which alerts.yaml does not have", name)
		}
	}
}

// Processes from before pgworker_outcomes_unrecorded export no such gauge:
// the silent-workers rule then compares the running rows with the busy
// slots alone, as it did.
func TestSilentWorkersRuleWithoutTheUnrecordedGauge(t *testing.T) {
	t.Parallel()
	groups, engine := rulesToEvaluate(t)
	older := func(running string) string {
		return loadScript(map[string]string{
			`pgworker_outcomes_unrecorded{instance="a"}`:                "",
			`pgworker_outcomes_unrecorded{instance="b"}`:                "",
			`pgworker_queue_running_rows{instance="a",queue="default"}`: running,
			`pgworker_queue_running_rows{instance="b",queue="default"}`: running,
		})
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "PgworkerSilentWorkersHoldRows" {
				continue
			}
			hold := time.Duration(r.For)
			if firing(t, engine, older("4x90"), r.Expr, hold) {
				t.Error("fires on a healthy fleet of older processes")
			}
			if !firing(t, engine, older("6x90"), r.Expr, hold) {
				t.Error("does not fire on older processes' fleet with two rows held by silent workers")
			}
			return
		}
	}
	t.Fatal("no rule PgworkerSilentWorkersHoldRows")
}
