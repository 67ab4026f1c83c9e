package lastseenprom

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metricsql"
	"github.com/lastseen/lastseen"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// The dashboard, the alerting rules and their promtool unit tests shipped
// with the module.
const (
	dashboardFile = "dashboards/lastseen.json"
	rulesFile     = "alerts/lastseen.rules.yml"
	rulesTestFile = "alerts/lastseen.rules.test.yml"
)

// requiredPanels are the titles of the panels the dashboard must have.
var requiredPanels = []string{
	"Touches by result",
	"Recorded rate",
	"Pending and in-flight users",
	"Oldest pending age",
	"Flush duration",
	"Flush rows by outcome",
	"Backlog and drops",
	"Redis evictions",
	"Breaker state",
	"Purge deletions and errors",
	"Rule rows and errors",
	"Rule duration",
}

// requiredAlerts are the alerting rules, exactly.
var requiredAlerts = []string{
	"LastseenOldestPendingTooOld",
	"LastseenFlushFailing",
	"LastseenBacklogDropping",
	"LastseenTimestampsDropped",
	"LastseenRedisEvictions",
	"LastseenRedisBreakerOpen",
	"LastseenPurgeFailing",
	"LastseenRuleFailing",
	"LastseenBufferUnreadable",
}

// exportedMetrics returns the series names a scrape of the collector has,
// after a touch, a flush, a purge and a run of a rule (the histograms and
// the last flush and rule run times appear after their first run): every family's name, and for a
// histogram its _bucket, _sum and _count instead. It fails unless every
// family the collector describes is in the scrape.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	ctx := context.Background()
	e := newEnv(t, &lastseen.User{}, lastseen.Rule{Name: "idle", After: time.Hour, Schedule: "off"})
	reg := prometheus.NewPedanticRegistry()
	c := register(t, reg, e)
	must(t, e.db.Create(&lastseen.User{ID: 1}).Error)
	_, err := e.p.Touch(ctx, 1)
	must(t, err)
	_, err = e.p.Flush(ctx)
	must(t, err)
	_, err = e.p.PurgeExpiredSessions(ctx)
	must(t, err)
	_, err = e.p.RunRule(ctx, "idle")
	must(t, err)
	mfs, err := reg.Gather()
	must(t, err)
	descs := make(chan *prometheus.Desc, 64)
	c.Describe(descs)
	close(descs)
	if len(mfs) != len(descs) {
		t.Fatalf("the scrape has %d metric families, the collector describes %d", len(mfs), len(descs))
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		switch n := mf.GetName(); mf.GetType() {
		case dto.MetricType_HISTOGRAM:
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[n], names[n+"_sum"], names[n+"_count"] = true, true, true
		default:
			names[n] = true
		}
	}
	return names
}

// grafanaVars replaces Grafana's interval variables, which PromQL does not
// parse in a range, with durations. Template variables in label matchers
// are inside strings and parse as they are.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// selector is one series selector of an expression: its metric name and
// label filters.
type selector struct {
	name    string
	filters []metricsql.LabelFilter
}

// selectors parses expr (PromQL, which MetricsQL extends) and returns its
// series selectors, those of range vectors and subqueries included, one
// per or-group of a selector's braces. A selector without a metric name
// ({__name__=~...} or only labels) is an error: its metrics could not be
// checked.
func selectors(expr string) ([]selector, error) {
	e, err := metricsql.Parse(grafanaVars.Replace(expr))
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", expr, err)
	}
	var sels []selector
	metricsql.VisitAll(e, func(n metricsql.Expr) {
		me, ok := n.(*metricsql.MetricExpr)
		if !ok {
			return
		}
		for _, group := range me.LabelFilterss {
			var sel selector
			for _, f := range group {
				if f.Label == "__name__" && !f.IsRegexp && !f.IsNegative {
					sel.name = f.Value
				} else {
					sel.filters = append(sel.filters, f)
				}
			}
			if sel.name == "" {
				err = fmt.Errorf("%q: selector %s has no metric name", expr, me.AppendString(nil))
			}
			sels = append(sels, sel)
		}
	})
	return sels, err
}

// unknownMetrics returns the metric names expr selects that are not in
// known, sorted, without repeats.
func unknownMetrics(expr string, known map[string]bool) ([]string, error) {
	sels, err := selectors(expr)
	if err != nil {
		return nil, err
	}
	var unknown []string
	for _, sel := range sels {
		if !known[sel.name] {
			unknown = append(unknown, sel.name)
		}
	}
	slices.Sort(unknown)
	return slices.Compact(unknown), nil
}

// checkMetrics reports, as from where, an expression that does not parse
// or names metrics not in known.
func checkMetrics(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	unknown, err := unknownMetrics(expr, known)
	if err != nil {
		t.Errorf("%s: %v", where, err)
	} else if unknown != nil {
		t.Errorf("%s: metrics %q are not exported by the collector, in %s", where, unknown, expr)
	}
}

// TestUnknownMetrics: the check finds a misspelt metric, a histogram named
// by its family instead of a series, and one inside a subquery, and does
// not take functions, aggregations, label names or strings for metrics.
func TestUnknownMetrics(t *testing.T) {
	known := map[string]bool{"lastseen_touches_total": true, "lastseen_flush_duration_seconds_bucket": true,
		"lastseen_last_successful_flush_timestamp_seconds": true}
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`sum by (result) (rate(lastseen_touches_total{result="recorded", job=~"$job"}[$__rate_interval]))`, nil},
		{`time() - max without (instance) (lastseen_last_successful_flush_timestamp_seconds)`, nil},
		{`histogram_quantile(0.95, sum by (le) (rate(lastseen_flush_duration_seconds_bucket[5m])))`, nil},
		{`rate(lastseen_touches_totl[5m]) / rate(lastseen_touches_total[5m])`, []string{"lastseen_touches_totl"}},
		{`lastseen_flush_duration_seconds > 1 or lastseen_flush_duration_seconds < 0`, []string{"lastseen_flush_duration_seconds"}},
		{`max_over_time(lastseen_nope[1h:1m]) unless on (table) lastseen_touches_total`, []string{"lastseen_nope"}},
	} {
		got, err := unknownMetrics(c.expr, known)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("unknownMetrics(%s) = %q, %v; want %q", c.expr, got, err, c.want)
		}
	}
	for _, expr := range []string{`{job="api"}`, `sum(rate(lastseen_touches_total[5m])`} {
		if _, err := unknownMetrics(expr, known); err == nil {
			t.Errorf("unknownMetrics(%s): no error", expr)
		}
	}
}

type dashDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashPanel struct {
	Title      string          `json:"title"`
	Type       string          `json:"type"`
	Datasource *dashDatasource `json:"datasource"`
	Targets    []struct {
		Datasource *dashDatasource `json:"datasource"`
		Expr       string          `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"` // a collapsed row's
}

type dashboard struct {
	SchemaVersion int         `json:"schemaVersion"`
	Panels        []dashPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Datasource *dashDatasource `json:"datasource"`
			Query      json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// promDatasource is the datasource of every panel, target and query
// variable: the dashboard's datasource variable.
var promDatasource = dashDatasource{Type: "prometheus", UID: "${datasource}"}

// labelValues matches a query variable's label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	must(t, err)
	var d dashboard
	must(t, json.Unmarshal(b, &d))
	return d
}

// variableExprs checks the template variables (a Prometheus datasource
// variable and the job, instance and table query variables) and returns
// the selectors of the query variables, by variable name.
func variableExprs(t *testing.T, d dashboard) map[string]string {
	t.Helper()
	exprs := map[string]string{}
	types := map[string]string{}
	for _, v := range d.Templating.List {
		types[v.Name] = v.Type
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q.Query); err != nil {
			must(t, json.Unmarshal(v.Query, &q))
		}
		switch v.Type {
		case "datasource":
			if q.Query != "prometheus" {
				t.Errorf("datasource variable %s: query %q, want prometheus", v.Name, q.Query)
			}
		case "query":
			m := labelValues.FindStringSubmatch(q.Query)
			if m == nil || v.Datasource == nil || *v.Datasource != promDatasource {
				t.Errorf("variable %s: query %q on %+v, want label_values(selector, label) on %+v", v.Name, q.Query, v.Datasource, promDatasource)
				continue
			}
			exprs[v.Name] = m[1]
		}
	}
	want := map[string]string{"datasource": "datasource", "job": "query", "instance": "query", "table": "query"}
	if !maps.Equal(types, want) {
		t.Errorf("template variables %v, want %v", types, want)
	}
	return exprs
}

// panelExprs checks every panel's type, title and datasources and adds the
// PromQL expressions of its targets to exprs, by panel title; rows are
// walked, not added.
func panelExprs(t *testing.T, panels []dashPanel, exprs map[string][]string) {
	t.Helper()
	for _, p := range panels {
		if p.Type == "row" {
			panelExprs(t, p.Panels, exprs)
			continue
		}
		if p.Type != "timeseries" && p.Type != "stat" {
			t.Errorf("panel %q: type %q, want timeseries or stat", p.Title, p.Type)
		}
		if _, dup := exprs[p.Title]; dup || p.Title == "" {
			t.Errorf("panel title %q empty or used twice", p.Title)
		}
		if p.Datasource == nil || *p.Datasource != promDatasource || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %+v, %d targets; want %+v and targets", p.Title, p.Datasource, len(p.Targets), promDatasource)
		}
		exprs[p.Title] = nil
		for _, tg := range p.Targets {
			if tg.Datasource == nil || *tg.Datasource != promDatasource || tg.Expr == "" {
				t.Errorf("panel %q: a target on %+v with expr %q", p.Title, tg.Datasource, tg.Expr)
			}
			exprs[p.Title] = append(exprs[p.Title], tg.Expr)
		}
	}
}

// TestDashboard: the Grafana dashboard has the current schema, a
// Prometheus datasource variable every panel uses, the required panels,
// and PromQL that names only metrics the collector exports, every panel
// selector filtered by the job, instance and table variables.
func TestDashboard(t *testing.T) {
	known := exportedMetrics(t)
	d := readDashboard(t)
	if d.SchemaVersion != 39 {
		t.Errorf("schemaVersion %d, want 39", d.SchemaVersion)
	}
	for name, expr := range variableExprs(t, d) {
		checkMetrics(t, "variable "+name, expr, known)
	}
	exprs := map[string][]string{}
	panelExprs(t, d.Panels, exprs)
	for _, title := range requiredPanels {
		if _, ok := exprs[title]; !ok {
			t.Errorf("no panel titled %q", title)
		}
	}
	filters := []metricsql.LabelFilter{
		{Label: "job", Value: "$job", IsRegexp: true},
		{Label: "instance", Value: "$instance", IsRegexp: true},
		{Label: "table", Value: "$table", IsRegexp: true},
	}
	for title, list := range exprs {
		for _, expr := range list {
			checkMetrics(t, fmt.Sprintf("panel %q", title), expr, known)
			sels, _ := selectors(expr)
			for _, sel := range sels {
				for _, f := range filters {
					if !slices.Contains(sel.filters, f) {
						t.Errorf("panel %q: a selector of %s lacks %s=~%q", title, sel.name, f.Label, f.Value)
					}
				}
			}
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// ruleTests is the part of a promtool test file this test reads.
type ruleTests struct {
	Tests []struct {
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// decodeYAML decodes file into v, refusing fields v does not have when
// strict.
func decodeYAML(t *testing.T, file string, v any, strict bool) {
	t.Helper()
	b, err := os.ReadFile(file)
	must(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(strict)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// TestAlertRules: the rules file has exactly the required alerts, each with
// a positive `for`, a warning or critical severity, a summary and a
// description, and PromQL naming only metrics the collector exports; the
// promtool tests have, for each, a case where it fires and one where it
// does not.
func TestAlertRules(t *testing.T) {
	known := exportedMetrics(t)
	var rf ruleFile
	decodeYAML(t, rulesFile, &rf, true)
	var names []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
			if d, err := model.ParseDuration(r.For); err != nil || d <= 0 {
				t.Errorf("%s: for %q, want a positive duration", r.Alert, r.For)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: annotations %v, want a summary and a description", r.Alert, r.Annotations)
			}
			checkMetrics(t, r.Alert, r.Expr, known)
		}
	}
	if !slices.Equal(names, requiredAlerts) {
		t.Errorf("alerts %q, want %q", names, requiredAlerts)
	}

	var rt ruleTests
	decodeYAML(t, rulesTestFile, &rt, false)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range rt.Tests {
		for _, a := range tc.AlertRuleTest {
			fires[a.Alertname] = fires[a.Alertname] || len(a.ExpAlerts) > 0
			quiet[a.Alertname] = quiet[a.Alertname] || len(a.ExpAlerts) == 0
		}
	}
	for _, name := range requiredAlerts {
		if !fires[name] || !quiet[name] {
			t.Errorf("%s: promtool cases firing %v, not firing %v; want both", name, fires[name], quiet[name])
		}
	}
}
