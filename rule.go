package lastseen

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// Rule is an inactivity rule: the rows of Model whose last activity
// (Field) is at or before now − After are inactive, and so are the rows
// never seen (Field NULL) created at or before now − After. The Inactive
// scope selects them; RunRule, and the scheduler by Schedule, act on them
// as the session purge deletes expired sessions: at a cutoff frozen at the
// run's start, by primary key in batches of BatchSize, each batch in a
// transaction of its own in which the rule is checked again, one instance
// at a time (a lock per rule), and never on a row whose newer activity is
// still in the buffer of the plugin that tracks Field. Soft-deleted rows
// are left out, as by any GORM query.
//
//	lastseen.Rule{Name: "revoke-unused-tokens", Model: &APIToken{}, Field: "LastUsedAt",
//		After: 90 * 24 * time.Hour, Where: "revoked_at IS NULL", Action: revokeTokens}
//
// A rule must not meet the rows it acted on again: its Action deletes them
// or changes a column its Where tests (revoked_at, warned_at, dormant). A
// batch whose Action leaves a row the rule still finds inactive fails and
// rolls back, and the run stops with an error naming the row.
type Rule struct {
	// Name names the rule in RunRule, DryRunRule, the Inactive scope, logs,
	// the rule's lock and the lastseen command: 1 to 64 letters, digits,
	// '-', '_' or '.', unique among the rules of the plugins on one
	// *gorm.DB. Required.
	Name string
	// Model is the rule's model, a pointer to a struct with exactly one
	// primary key; a model another plugin on the *gorm.DB tracks works
	// too. Default Config.Model.
	Model any
	// Field names Model's last-activity field, by Go field name or column
	// name, of any type Config.Field takes. Default Config.Field.
	Field string
	// After is how long without activity makes a row inactive. Required:
	// at least 1s.
	After time.Duration
	// CreatedField names the creation time of a row, which stands for the
	// activity of a row never seen (Field NULL). Default: the field GORM
	// fills on create (CreatedAt, or a field tagged autoCreateTime), if
	// Model has one. "-", or a Model without one: a row never seen is never
	// inactive.
	CreatedField string
	// Where is a SQL condition on Model's table a row must also meet, such
	// as "revoked_at IS NULL" or "dormant = false", written without bound
	// values (it goes into every statement as it is, in parentheses, and
	// is recorded for the lastseen command). Default "": none.
	Where string
	// Action gets the primary keys of each batch's inactive rows (at most
	// BatchSize, in key order, as the key field's Go type: int64, string,
	// ...; locked FOR UPDATE where the dialect has it) in the batch's
	// transaction, which commits when it returns nil; an error rolls the
	// batch back and stops the run, wrapped in RunRule's error. On a retried deadlock
	// or a batch split around a row the database refuses, it runs again
	// for the same rows: keep what it does outside the transaction
	// idempotent. Default nil: delete the rows (GORM's Delete: a soft
	// delete when Model has a gorm.DeletedAt field), hooks skipped.
	Action func(tx *gorm.DB, ids []any) error
	// Schedule is when the scheduler runs the rule (specs as for
	// Flush.Schedule), or "off" to call RunRule yourself. Default
	// "@every 1h".
	Schedule string
	// BatchSize is the number of rows a batch acts on. Lower it when the
	// Action holds its transaction's row locks too long, or runs past the
	// 10s bound of a batch's transaction. Default 1000.
	BatchSize int
}

// ruleTarget is one resolved rule.
type ruleTarget struct {
	cfg       Rule           // as configured, defaults filled in
	opt       string         // "Rules[i]", how messages name it
	model     *model         // the rule's model; time is the activity field
	created   *timecol.Codec // the creation column; nil when none
	softField string         // the gorm.DeletedAt column, "" when none (the manifest)
	lost      error          // the cause that stops a run whose lock was lost
	schemaOK  atomic.Bool    // the table was found to fit the rule
	schemaLog logLimiter     // the scheduled run's schema errors
	n         ruleCounters   // the rule's part of Stats
}

// ruleName is what a rule's Name may hold: it becomes part of a Redis key.
var ruleName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// checkRules checks the rules' values: names, durations, batch sizes
// (one bind parameter per row and two for the cutoffs) and schedules.
func checkRules(c settings, d *dialect.Dialect) error {
	seen := map[string]bool{}
	for i, r := range c.Rules {
		opt := fmt.Sprintf("Rules[%d]", i)
		switch {
		case !ruleName.MatchString(r.Name):
			return invalid("%s.Name %q: want 1 to 64 letters, digits, '-', '_' or '.'", opt, r.Name)
		case seen[r.Name]:
			return invalid("%s.Name %q: two rules have this name", opt, r.Name)
		case r.After < time.Second:
			return invalid("%s.After is %v, want at least 1s", opt, r.After)
		case r.BatchSize < 1 || r.BatchSize > d.MaxParams()-2:
			return invalid("%s.BatchSize is %d, want 1 to %d (the %s limit of %d bind parameters, 1 per row and 2 for the cutoffs)",
				opt, r.BatchSize, d.MaxParams()-2, d.Name(), d.MaxParams())
		}
		seen[r.Name] = true
		if r.Schedule != scheduleOff {
			if err := checkSchedule(opt+".Schedule", r.Schedule); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolveRules resolves the rules' models and columns against db. A rule
// on the tracked column shares its codec.
func (p *Plugin) resolveRules(db *gorm.DB, d *dialect.Dialect, loc *time.Location) error {
	p.rules = make([]*ruleTarget, len(p.cfg.Rules))
	for i, r := range p.cfg.Rules {
		opt := fmt.Sprintf("Rules[%d]", i)
		m, err := resolveModel(db, r.Model, r.Field, opt+".Model", opt+".Field", timecol.Auto, d, loc)
		if err != nil {
			return invalid("%v", err)
		}
		if u := p.users.model; m.table == u.table && m.time.DBName == u.time.DBName {
			m.enc = u.enc
		}
		rt := &ruleTarget{cfg: r, opt: opt, model: m, lost: fmt.Errorf("lastseen: rule %q: lost the rule's lock", r.Name)}
		if f, err := createdField(m.schema, r.CreatedField, opt); err != nil {
			return invalid("%v", err)
		} else if f != nil {
			if rt.created, err = timecol.New(m.schema, f, cmp.Or(r.CreatedField, f.Name), timecol.Auto, opt+".CreatedField", d.Naive(), loc); err != nil {
				return invalid("%v", err)
			}
		}
		for _, f := range m.schema.Fields {
			if f.DBName != "" && f.FieldType == reflect.TypeOf(gorm.DeletedAt{}) {
				rt.softField = f.DBName
			}
		}
		p.rules[i] = rt
	}
	return nil
}

// createdField is the creation field name names in s: none for "-", GORM's
// for "" (CreatedAt when GORM fills it on create, else the first field it
// fills on create, else none).
func createdField(s *schema.Schema, name, opt string) (*schema.Field, error) {
	switch name {
	case "-":
		return nil, nil
	case "":
		if f := s.LookUpField("CreatedAt"); f != nil && f.DBName != "" && f.AutoCreateTime != 0 {
			return f, nil
		}
		for _, f := range s.Fields {
			if f.DBName != "" && f.AutoCreateTime != 0 {
				return f, nil
			}
		}
		return nil, nil
	}
	f := s.LookUpField(name)
	if f == nil || f.DBName == "" {
		return nil, fmt.Errorf("%s.CreatedField %q: %s has no such field or column", opt, name, s.Name)
	}
	return f, nil
}

// ruleTaken returns the error of a rule of p whose name a rule of another
// plugin on db has, or nil.
func (p *Plugin) ruleTaken(db *gorm.DB) error {
	for _, o := range pluginsOn(db) {
		if o == p {
			continue
		}
		for _, r := range p.rules {
			if o.ruleNamed(r.cfg.Name) != nil {
				return invalid("%s.Name %q: the plugin %s on this *gorm.DB has a rule of this name: give each rule its own name", r.opt, r.cfg.Name, o.name)
			}
		}
	}
	return nil
}

// ruleNamed returns p's rule name, or nil.
func (p *Plugin) ruleNamed(name string) *ruleTarget {
	for _, r := range p.rules {
		if r.cfg.Name == name {
			return r
		}
	}
	return nil
}

// rule returns p's rule name, or an error naming p's rules.
func (p *Plugin) rule(name string) (*ruleTarget, error) {
	if r := p.ruleNamed(name); r != nil {
		return r, nil
	}
	names := make([]string, len(p.rules))
	for i, r := range p.rules {
		names[i] = r.cfg.Name
	}
	return nil, fmt.Errorf("lastseen: no rule %q in this plugin's Config.Rules (it has %q)", name, names)
}

// inactive is the rule's condition at cutoff: the activity column at or
// before cutoff − After, or, for a row never seen, the creation column
// at or before it; and Where. Columns are qualified with the current table
// and compared as instants in their encodings (compareTime).
func (r *ruleTarget) inactive(db *gorm.DB, cutoff time.Time) clause.Expression {
	cut := cutoff.UTC().Add(-r.cfg.After)
	act := clause.Column{Table: clause.CurrentTable, Name: r.model.time.DBName}
	cond := clause.Expression(compareTime(db, r.model.enc, act, "<=", cut))
	if r.created != nil {
		created := clause.Column{Table: clause.CurrentTable, Name: r.created.Field().DBName}
		cond = clause.Expr{SQL: "(? OR (? IS NULL AND ?))", Vars: []any{cond, act, compareTime(db, r.created, created, "<=", cut)}}
	}
	if r.cfg.Where == "" {
		return cond
	}
	return clause.And(cond, clause.Expr{SQL: "(" + r.cfg.Where + ")"})
}

// newRow is a pointer to a new value of the rule's model.
func (r *ruleTarget) newRow() any { return reflect.New(r.model.typ).Interface() }

// keysOf returns the primary keys of the rows in dest, a pointer to a slice
// of the model, leaving out zero keys.
func keysOf(ctx context.Context, m *model, dest reflect.Value) []any {
	rows := dest.Elem()
	ids := make([]any, 0, rows.Len())
	for i := range rows.Len() {
		if v, zero := m.pk.ValueOf(ctx, rows.Index(i)); !zero {
			ids = append(ids, v)
		}
	}
	return ids
}

// errActionLeft is the error of a batch whose Action left rows the rule
// still finds inactive.
var errActionLeft = errors.New("the rule's Action left rows the rule still finds inactive")

// ruleRecord is what the buffer's manifest records of a rule for the
// lastseen command, which acts by it (a JSON object per rule, in the
// manifest field "rules"): the table, its key and columns with their
// encodings, the rule's values, and whether the app deletes or runs an
// Action, which the command cannot.
type ruleRecord struct {
	Name            string `json:"name"`
	Table           string `json:"table"`
	IDColumn        string `json:"id_column"`
	Key             string `json:"key"` // "signed", "unsigned" or "text" (keyKind)
	Column          string `json:"column"`
	Encoding        string `json:"encoding"`
	CreatedColumn   string `json:"created_column,omitempty"`
	CreatedEncoding string `json:"created_encoding,omitempty"`
	SoftDelete      string `json:"soft_delete,omitempty"` // the gorm.DeletedAt column
	After           string `json:"after"`                 // time.Duration's String
	Where           string `json:"where,omitempty"`
	Action          string `json:"action"` // "delete", or "app": the app's Action
	Batch           int    `json:"batch"`
}

// rulesManifest is the manifest's "rules": the JSON array of p's rules
// (ruleRecord), "" without rules.
func (p *Plugin) rulesManifest() string {
	if len(p.rules) == 0 {
		return ""
	}
	recs := make([]ruleRecord, len(p.rules))
	for i, r := range p.rules {
		m := r.model
		recs[i] = ruleRecord{Name: r.cfg.Name, Table: m.table, IDColumn: m.pk.DBName, Key: keyKind(m.pk),
			Column: m.time.DBName, Encoding: m.enc.Encoding().String(), SoftDelete: r.softField,
			After: r.cfg.After.String(), Where: r.cfg.Where, Action: "delete", Batch: r.cfg.BatchSize}
		if r.created != nil {
			recs[i].CreatedColumn, recs[i].CreatedEncoding = r.created.Field().DBName, r.created.Encoding().String()
		}
		if r.cfg.Action != nil {
			recs[i].Action = "app"
		}
	}
	b, _ := json.Marshal(recs) // strings and numbers: it cannot fail
	return string(b)
}
