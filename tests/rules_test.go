package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/robfig/cron/v3"
	"gorm.io/gorm"
)

// apiToken is the token model of the rule tests: tracked by LastUsedAt,
// created at CreatedAt, warned and revoked by the app, soft-deletable.
type apiToken struct {
	ID         uint64 `gorm:"primaryKey;autoIncrement:false"`
	LastUsedAt *time.Time
	CreatedAt  time.Time
	WarnedAt   *time.Time
	DeletedAt  gorm.DeletedAt
}

// ruleTokens seeds the tokens of the rule tests. The clock is
// 2026-03-01T09:30:00Z; 80 days before is 2025-12-11T09:30:00Z, 90 days
// 2025-12-01T09:30:00Z:
//
//	1  used 2025-11-01                        inactive at 80 and 90 days
//	2  used 2025-12-01T09:30:00 (90d exactly)  inactive at 80 and 90 days (the boundary)
//	3  used 2025-12-01T09:30:01                inactive at 80 days only
//	4  never used, created 2025-10-01          inactive (by its creation)
//	5  never used, created 2026-02-01          live
//	6  used 2025-11-01, touched 2026-02-28     buffered before the run: kept
//	7  used 2025-11-01                         touched during the run (rulesHook)
//	8  used 2025-11-01, soft-deleted           left out
//	9  used 2025-11-01, warned 2026-02-20      left out of the warning (its Where)
//	10 used 2025-11-01, touched 2025-11-15     buffered, still inactive
func ruleTokens() []apiToken {
	at := func(s string) *time.Time { return ptr(mustTime(s)) }
	old, created := at("2025-11-01T00:00:00Z"), mustTime("2025-09-01T00:00:00Z")
	return []apiToken{
		{ID: 1, LastUsedAt: old, CreatedAt: created},
		{ID: 2, LastUsedAt: at("2025-12-01T09:30:00Z"), CreatedAt: created},
		{ID: 3, LastUsedAt: at("2025-12-01T09:30:01Z"), CreatedAt: created},
		{ID: 4, CreatedAt: mustTime("2025-10-01T00:00:00Z")},
		{ID: 5, CreatedAt: mustTime("2026-02-01T00:00:00Z")},
		{ID: 6, LastUsedAt: old, CreatedAt: created},
		{ID: 7, LastUsedAt: old, CreatedAt: created},
		{ID: 8, LastUsedAt: old, CreatedAt: created, DeletedAt: gorm.DeletedAt{Time: mustTime("2026-01-01T00:00:00Z"), Valid: true}},
		{ID: 9, LastUsedAt: old, CreatedAt: created, WarnedAt: at("2026-02-20T00:00:00Z")},
		{ID: 10, LastUsedAt: old, CreatedAt: created},
	}
}

// actionLog keeps the ids each batch handed to an Action, "[1 2]" per call.
type actionLog struct {
	mu    sync.Mutex
	calls []string
}

func (r *actionLog) add(ids []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprint(ids))
}

func (r *actionLog) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := strings.Join(r.calls, " ")
	r.calls = nil
	return out
}

// rulesSetup registers on one handle a users plugin that carries the
// token rules (warn at 80 days: the actionLog's Action sets warned_at;
// delete at 90 days) and, with its own buffer, the plugin that tracks the
// tokens' LastUsedAt; it seeds ruleTokens and touches 6 and 10.
func rulesSetup(t *testing.T, h *harness, warned *actionLog) (users, tokens *lastseen.Plugin, db *gorm.DB) {
	t.Helper()
	ctx := context.Background()
	db = h.openDB()
	must(t, db.AutoMigrate(&apiToken{}, &lastseen.User{}))
	must(t, db.Create(ruleTokens()).Error)
	now := h.clock.Now
	uc := h.config()
	uc.Buffer.Prefix = h.prefix + ":users"
	uc.Sessions.Disabled = true
	uc.Rules = []lastseen.Rule{
		{Name: "warn-80d", Model: &apiToken{}, Field: "LastUsedAt", After: 80 * 24 * time.Hour, BatchSize: 2,
			Where: "warned_at IS NULL", Schedule: "off",
			Action: func(tx *gorm.DB, ids []any) error {
				warned.add(ids)
				return tx.Model(&apiToken{}).Where("id IN ?", ids).Update("warned_at", now()).Error
			}},
		{Name: "delete-90d", Model: &apiToken{}, Field: "last_used_at", After: 90 * 24 * time.Hour, BatchSize: 2, Schedule: "off"},
	}
	tc := h.config()
	tc.Buffer.Prefix = h.prefix + ":tokens"
	tc.Model, tc.Field, tc.Sessions.Disabled = &apiToken{}, "LastUsedAt", true
	users, tokens = lastseen.New(uc), lastseen.New(tc)
	must(t, db.Use(users))
	must(t, db.Use(tokens))
	t.Cleanup(func() { users.Close(context.Background()); tokens.Close(context.Background()) })
	db.Config.NowFunc = h.clock.Now
	for id, at := range map[uint64]string{6: "2026-02-28T00:00:00Z", 10: "2025-11-15T00:00:00Z"} {
		_, err := tokens.TouchAt(ctx, id, mustTime(at))
		must(t, err)
	}
	return users, tokens, db
}

// tokenIDs lists the ids q finds, in order.
func tokenIDs(t *testing.T, q *gorm.DB) string {
	t.Helper()
	var ids []uint64
	must(t, q.Order("id").Pluck("id", &ids).Error)
	return fmt.Sprint(ids)
}

// TestRulesActInBatches: two rules on a model another plugin tracks, run
// at a frozen cutoff in batches of two. The warning's Action gets, per
// batch, the rows the rule still finds inactive when it acts: not 3, whose
// column a flush moved forward after the batch was selected, not 7,
// touched after it was selected (still in the tracker's buffer), not 6,
// buffered before; 10, whose buffered activity is older than the cutoff,
// is warned. A second run warns nobody again (its Where). The scope and the
// dry run agree with the run; the delete soft-deletes (the model has a
// gorm.DeletedAt), leaves out the soft-deleted 8 and the buffered 6 and 7.
// A batch whose rows are all held back by the buffer (6 and 7) opens no
// transaction and is not counted; the rows are counted Kept, per run and
// in RuleStats.
func TestRulesActInBatches(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		warned := &actionLog{}
		users, tokens, db := rulesSetup(t, h, warned)

		equal(t, "Inactive warn-80d", tokenIDs(t, db.Model(&apiToken{}).Scopes(lastseen.Inactive("warn-80d"))), "[1 2 3 4 6 7 10]")
		equal(t, "Inactive warn-80d, Unscoped", tokenIDs(t, db.Unscoped().Model(&apiToken{}).Scopes(lastseen.Inactive("warn-80d"))), "[1 2 3 4 6 7 8 10]")
		equal(t, "Inactive delete-90d", tokenIDs(t, db.Model(&apiToken{}).Scopes(lastseen.Inactive("delete-90d"))), "[1 2 4 6 7 9 10]")
		dry, err := users.DryRunRule(ctx, "warn-80d")
		must(t, err)
		equal(t, "DryRunRule warn-80d", fmt.Sprintf("act on %d, kept %d, oldest %s, cutoff %s", dry.Expired, dry.Kept,
			dry.Oldest.Format(time.RFC3339), dry.Cutoff.Format(time.RFC3339)), "act on 6, kept 1, oldest 2025-10-01T00:00:00Z, cutoff 2026-03-01T09:30:00Z")

		var hooked []string
		seam(users).Purge.AfterSelect = func(rule string, batch int, ids []any) {
			hooked = append(hooked, fmt.Sprintf("%s#%d%v", rule, batch, ids))
			switch {
			case rule == "warn-80d" && batch == 2: // a flush wrote 3's newer use meanwhile
				must(t, db.Model(&apiToken{}).Where("id = ?", 3).Update("last_used_at", mustTime("2026-03-01T09:00:00Z")).Error)
			case rule == "warn-80d" && batch == 3: // 7 is used now: its touch waits in the buffer
				_, err := tokens.TouchAt(ctx, uint64(7), mustTime("2026-03-01T09:29:00Z"))
				must(t, err)
			}
		}
		res, err := users.RunRule(ctx, "warn-80d")
		must(t, err)
		equal(t, "batches selected", strings.Join(hooked, " "), "warn-80d#1[1 2] warn-80d#2[3 4] warn-80d#3[6 7] warn-80d#4[10]")
		equal(t, "Action's batches", warned.take(), "[1 2] [4] [10]")
		equal(t, "warn result", fmt.Sprintf("acted=%d batches=%d kept=%d cutoff=%s stopped=%v", res.Deleted, res.Batches, res.Kept,
			res.Cutoff.Format(time.RFC3339), res.Stopped), "acted=4 batches=3 kept=2 cutoff=2026-03-01T09:30:00Z stopped=false")
		equal(t, "warned", tokenIDs(t, db.Unscoped().Model(&apiToken{}).Where("warned_at IS NOT NULL")), "[1 2 4 9 10]")

		hooked = nil
		res, err = users.RunRule(ctx, "warn-80d") // nothing is warned twice
		must(t, err)
		equal(t, "second warning run: batches selected", strings.Join(hooked, " "), "warn-80d#1[6 7]")
		equal(t, "second warning run: Action's batches", warned.take(), "")
		equal(t, "second warning run", fmt.Sprintf("acted=%d batches=%d kept=%d", res.Deleted, res.Batches, res.Kept), "acted=0 batches=0 kept=2")

		hooked = nil
		res, err = users.RunRule(ctx, "delete-90d")
		must(t, err)
		equal(t, "delete: batches selected", strings.Join(hooked, " "), "delete-90d#1[1 2] delete-90d#2[4 6] delete-90d#3[7 9] delete-90d#4[10]")
		equal(t, "delete: deleted", res.Deleted, 5)
		equal(t, "tokens left", tokenIDs(t, db.Model(&apiToken{})), "[3 5 6 7]")
		equal(t, "tokens soft-deleted", tokenIDs(t, db.Unscoped().Model(&apiToken{}).Where("deleted_at IS NOT NULL")), "[1 2 4 8 9 10]")
		st := users.Stats()
		equal(t, "Stats", fmt.Sprintf("runs=%d errors=%d skipped=%d rows=%d purges=%d", st.RuleRuns, st.RuleErrors, st.RuleSkipped, st.RuleRows, st.Purges),
			"runs=3 errors=0 skipped=0 rows=9 purges=0")
		equal(t, "RuleStats", fmt.Sprintf("%+v", users.RuleStats()),
			"[{Name:warn-80d Table:api_tokens Runs:2 Errors:0 Skipped:0 Rows:4 Batches:3 Kept:4 Refused:0 LastRun:2026-03-01 09:30:00 +0000 UTC} "+
				"{Name:delete-90d Table:api_tokens Runs:1 Errors:0 Skipped:0 Rows:5 Batches:4 Kept:2 Refused:0 LastRun:2026-03-01 09:30:00 +0000 UTC}]")
		equal(t, "RuleStats of the plugin without rules", tokens.RuleStats() == nil, true)

		// After the tokens' flush, 6 and 7 are live in the table too.
		_, err = tokens.Flush(ctx)
		must(t, err)
		equal(t, "Inactive delete-90d after the flush", tokenIDs(t, db.Model(&apiToken{}).Scopes(lastseen.Inactive("delete-90d"))), "[]")
	})
}

// unixDevice has Unix-time columns: LastSeen in seconds, Created in
// milliseconds (GORM fills it on create), and no soft delete.
type unixDevice struct {
	ID       string `gorm:"primaryKey;size:32"`
	LastSeen *int64 `lastseen:"unix"`
	Created  int64  `gorm:"autoCreateTime:milli"`
}

// TestRulesUnixColumnsOwnBuffer: a rule on the plugin's own model and
// column, both Unix-time columns; the delete is a real one; a device never
// seen is inactive by its creation column, unless the rule names none
// ("-"); the plugin's own buffer guards the rows it holds.
func TestRulesUnixColumnsOwnBuffer(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		sec := func(s string) *int64 { return ptr(mustTime(s).Unix()) }
		ms := func(s string) int64 { return mustTime(s).UnixMilli() }
		// Now 2026-03-01T09:30:00Z, After 1h: inactive at or before 08:30:00.
		devices := []unixDevice{
			{ID: "a", LastSeen: sec("2026-03-01T08:30:00Z"), Created: ms("2026-01-01T00:00:00Z")}, // the boundary
			{ID: "b", LastSeen: sec("2026-03-01T08:30:01Z"), Created: ms("2026-01-01T00:00:00Z")}, // live
			{ID: "c", Created: ms("2026-03-01T08:30:00Z")},                                        // never seen, created at the boundary
			{ID: "d", Created: ms("2026-03-01T08:30:00.001Z")},                                    // never seen, new
			{ID: "e", LastSeen: sec("2026-03-01T07:00:00Z"), Created: ms("2026-01-01T00:00:00Z")}, // touched 09:00, buffered
		}
		cfg := h.config()
		cfg.Model, cfg.Field, cfg.Sessions.Disabled = &unixDevice{}, "LastSeen", true
		cfg.Rules = []lastseen.Rule{
			{Name: "forget", After: time.Hour, Schedule: "off"},
			{Name: "forget-seen", After: time.Hour, CreatedField: "-", Schedule: "off"},
		}
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&unixDevice{}))
		must(t, db.Create(devices).Error)
		db.Config.NowFunc = h.clock.Now
		_, err := p.TouchAt(ctx, "e", mustTime("2026-03-01T09:00:00Z"))
		must(t, err)
		ids := func(q *gorm.DB) string {
			var ids []string
			must(t, q.Order("id").Pluck("id", &ids).Error)
			return strings.Join(ids, ",")
		}

		equal(t, "Inactive forget-seen", ids(db.Model(&unixDevice{}).Scopes(lastseen.Inactive("forget-seen"))), "a,e")
		dry, err := p.DryRunRule(ctx, "forget")
		must(t, err)
		equal(t, "DryRunRule forget", fmt.Sprintf("%d kept %d oldest %s", dry.Expired, dry.Kept, dry.Oldest.Format(time.RFC3339)),
			"2 kept 1 oldest 2026-03-01T07:00:00Z")
		res, err := p.RunRule(ctx, "forget")
		must(t, err)
		equal(t, "forget: deleted", res.Deleted, 2)
		var all int64
		must(t, db.Unscoped().Model(&unixDevice{}).Count(&all).Error)
		equal(t, "devices left", ids(db.Model(&unixDevice{})), "b,d,e")
		equal(t, "rows in the table", all, int64(3))
	})
}

// TestRuleActionMustMoveRows: an Action that leaves a row the rule still
// finds inactive fails its batch, which rolls back, and the run stops with
// an error naming the row; an Action's own error does the same, wrapped.
func TestRuleActionMustMoveRows(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		db := h.openDB()
		must(t, db.AutoMigrate(&apiToken{}))
		must(t, db.Create(ruleTokens()).Error)
		boom := errors.New("mail server down")
		var calls []string
		cfg := h.config()
		cfg.Model, cfg.Field, cfg.Sessions.Disabled = &apiToken{}, "LastUsedAt", true
		cfg.Rules = []lastseen.Rule{
			{Name: "flag", After: 90 * 24 * time.Hour, Schedule: "off", BatchSize: 3, Action: func(tx *gorm.DB, ids []any) error {
				calls = append(calls, fmt.Sprint(ids))
				return tx.Model(&apiToken{}).Where("id IN ?", ids).Update("warned_at", h.clock.Now()).Error // no Where excludes it
			}},
			{Name: "mail", After: 90 * 24 * time.Hour, Schedule: "off", Action: func(*gorm.DB, []any) error { return boom }},
		}
		p := testenv.Use(t, db, cfg)
		db.Config.NowFunc = h.clock.Now
		res, err := p.RunRule(ctx, "flag")
		equal(t, "error", fmt.Sprint(err), `lastseen: rule "flag" batch 1: the rule's Action left rows the rule still finds inactive (id 1): `+
			`the next run would hand it to the Action again; make the Action delete its rows or change a column Rules[0].Where excludes`)
		equal(t, "result", fmt.Sprintf("acted=%d batches=%d stopped=%v", res.Deleted, res.Batches, res.Stopped), "acted=0 batches=0 stopped=true")
		equal(t, "Action's batches", strings.Join(calls, " "), "[1 2 4]")
		equal(t, "rolled back", tokenIDs(t, db.Unscoped().Model(&apiToken{}).Where("warned_at IS NOT NULL")), "[9]")

		res, err = p.RunRule(ctx, "mail")
		equal(t, "Action's error", errors.Is(err, boom), true)
		equal(t, "Action's error message", fmt.Sprint(err), `lastseen: rule "mail" batch 1: Action: mail server down`)
		equal(t, "Stats.RuleErrors", p.Stats().RuleErrors, int64(2))
		_, err = p.RunRule(ctx, "nope")
		equal(t, "unknown rule", fmt.Sprint(err), `lastseen: no rule "nope" in this plugin's Config.Rules (it has ["flag" "mail"])`)
	})
}

// TestRuleLock: one instance runs a rule at a time: while another holds
// the rule's lock, RunRule returns ErrLocked (Stats.RuleSkipped); the
// session purge's lock and another rule's do not stand in the way.
func TestRuleLock(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		warned := &actionLog{}
		users, _, _ := rulesSetup(t, h, warned)
		buf := internals(users).Buffer
		held, err := buf.LockRule(ctx, "warn-80d")
		must(t, err)
		purge, err := buf.LockPurge(ctx)
		must(t, err)
		_, err = users.RunRule(ctx, "warn-80d")
		equal(t, "held: ErrLocked", errors.Is(err, lastseen.ErrLocked), true)
		res, err := users.RunRule(ctx, "delete-90d")
		must(t, err)
		equal(t, "another rule runs", res.Deleted, 6) // 1, 2, 4, 7, 9 and 10; 6 is buffered
		held.Release(ctx)
		purge.Release(ctx)
		res, err = users.RunRule(ctx, "warn-80d")
		must(t, err)
		equal(t, "released: acted", res.Deleted, 1)
		equal(t, "Action's batches", warned.take(), "[3]")
		st := users.Stats()
		equal(t, "Stats", fmt.Sprintf("runs=%d skipped=%d", st.RuleRuns, st.RuleSkipped), "runs=2 skipped=1")
	})
}

// TestRuleStopsOnClose: Close during a run lets the batch commit and stops
// the run before the next one (ErrClosed).
func TestRuleStopsOnClose(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		warned := &actionLog{}
		users, _, db := rulesSetup(t, h, warned)
		closed := make(chan error, 1)
		seam(users).Purge.AfterSelect = func(rule string, batch int, _ []any) {
			if batch == 1 {
				go func() { closed <- users.Close(context.Background()) }()
				<-internals(users).Closing
			}
		}
		res, err := users.RunRule(ctx, "warn-80d")
		equal(t, "ErrClosed", errors.Is(err, lastseen.ErrClosed), true)
		equal(t, "result", fmt.Sprintf("acted=%d batches=%d stopped=%v", res.Deleted, res.Batches, res.Stopped), "acted=2 batches=1 stopped=true")
		must(t, <-closed)
		equal(t, "warned", tokenIDs(t, db.Unscoped().Model(&apiToken{}).Where("warned_at IS NOT NULL")), "[1 2 9]")
		equal(t, "Action's batches", warned.take(), "[1 2]")
	})
}

// apiTokenSeen is apiToken with a column its table lacks.
type apiTokenSeen struct {
	ID         uint64 `gorm:"primaryKey;autoIncrement:false"`
	LastUsedAt *time.Time
	SeenAt     *time.Time
}

func (apiTokenSeen) TableName() string { return "api_tokens" }

// TestRuleConfig: db.Use names a rule's bad value, and a column the
// rule's table lacks.
func TestRuleConfig(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	must(t, h.db.AutoMigrate(&apiToken{}))
	day := 24 * time.Hour
	for _, c := range []struct {
		name  string
		rules []lastseen.Rule
		want  string
	}{
		{"no name", []lastseen.Rule{{After: day}}, `lastseen: invalid config: Rules[0].Name "": want 1 to 64 letters, digits, '-', '_' or '.'`},
		{"a colon", []lastseen.Rule{{Name: "a:b", After: day}}, `lastseen: invalid config: Rules[0].Name "a:b": want 1 to 64 letters, digits, '-', '_' or '.'`},
		{"twice", []lastseen.Rule{{Name: "a", After: day}, {Name: "a", After: day}}, `lastseen: invalid config: Rules[1].Name "a": two rules have this name`},
		{"no After", []lastseen.Rule{{Name: "a"}}, "lastseen: invalid config: Rules[0].After is 0s, want at least 1s"},
		{"batch", []lastseen.Rule{{Name: "a", After: day, BatchSize: 32765}},
			"lastseen: invalid config: Rules[0].BatchSize is 32765, want 1 to 32764 (the sqlite limit of 32766 bind parameters, 1 per row and 2 for the cutoffs)"},
		{"schedule", []lastseen.Rule{{Name: "a", After: day, Schedule: "@every 1s; nope"}}, `lastseen: invalid config: Rules[0].Schedule "nope": expected exactly 5 fields, found 1: [nope]`},
		{"field", []lastseen.Rule{{Name: "a", After: day, Model: &apiToken{}, Field: "UsedAt"}},
			`lastseen: invalid config: Rules[0].Field "UsedAt": apiToken has no such field or column`},
		{"created", []lastseen.Rule{{Name: "a", After: day, Model: &apiToken{}, Field: "LastUsedAt", CreatedField: "MadeAt"}},
			`lastseen: invalid config: Rules[0].CreatedField "MadeAt": apiToken has no such field or column`},
		{"created not a time", []lastseen.Rule{{Name: "a", After: day, Model: &apiToken{}, Field: "LastUsedAt", CreatedField: "ID"}},
			`lastseen: invalid config: Rules[0].CreatedField "ID": apiToken.ID is a uint64: ` + wantIntUnit},
	} {
		cfg := h.config()
		cfg.Rules = c.rules
		equal(t, c.name, fmt.Sprint(h.openDB().Use(lastseen.New(cfg))), c.want)
	}
	wider := h.config()
	wider.Rules = []lastseen.Rule{{Name: "a", After: day, Model: &apiTokenSeen{}, Field: "LastUsedAt", CreatedField: "SeenAt"}}
	equal(t, "a column the table lacks", fmt.Sprint(h.openDB().Use(lastseen.New(wider))),
		`lastseen: invalid config: Config.Rules[0].CreatedField "SeenAt": table api_tokens has no column seen_at`)
	db := h.openDB()
	cfg := h.config()
	cfg.Rules = []lastseen.Rule{{Name: "same", After: day}}
	must(t, db.Use(lastseen.New(cfg)))
	other := h.config()
	other.Model, other.Field, other.Buffer.Prefix = &apiToken{}, "LastUsedAt", h.prefix+":tokens"
	other.Rules = []lastseen.Rule{{Name: "same", After: day}}
	equal(t, "a name another plugin on the handle has", fmt.Sprint(db.Use(lastseen.New(other))),
		`lastseen: invalid config: Rules[0].Name "same": the plugin lastseen:github.com/lastseen/lastseen.User.LastSeenAt on this *gorm.DB has a rule of this name: give each rule its own name`)
	var n int64
	err := db.Model(&apiToken{}).Scopes(lastseen.Inactive("same")).Count(&n).Error
	equal(t, "scope on another table", fmt.Sprint(err), "lastseen: Inactive: rule \"same\" is on table users, the statement on api_tokens")
	err = db.Model(&apiToken{}).Scopes(lastseen.Inactive("none")).Count(&n).Error
	equal(t, "unknown scope", fmt.Sprint(err), `lastseen: Inactive: no rule "none" in the Config.Rules of a plugin on this *gorm.DB`)
}

// TestRuleJob: a rule with a Schedule gets its cron entries after the
// flush's and the purge's (a rule "off" none); its job logs one line per
// run: Debug when nothing was inactive, Info with its counts, Debug when
// another instance holds the rule's lock.
func TestRuleJob(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	var out testenv.Logs
	must(t, h.db.AutoMigrate(&apiToken{}))
	cfg := h.config()
	cfg.Logger = testenv.JSONLogger(&out)
	cfg.Model, cfg.Field, cfg.Sessions.Disabled = &apiToken{}, "LastUsedAt", true
	cfg.Rules = []lastseen.Rule{
		{Name: "delete-90d", After: 90 * 24 * time.Hour, Schedule: "@every 1h; 30 3 * * *"},
		{Name: "by-hand", After: time.Hour, Schedule: "off"},
	}
	p, db := h.plugin(cfg)
	db.Config.NowFunc = h.clock.Now
	entries := internals(p).Scheduler.Entries()
	equal(t, "cron entries", len(entries), 2)
	equal(t, "entry 2", fmt.Sprint(internals(p).Scheduler.Entry(2).Schedule), fmt.Sprint(mustSpec(t, "30 3 * * *")))

	out.Take() // the scheduler's start
	job := internals(p).RuleJobs["delete-90d"]
	job(ctx)
	common := `"plugin":"lastseen:github.com/lastseen/lastseen/tests.apiToken.LastUsedAt","table":"api_tokens","prefix":"` + h.prefix +
		`","rule":"delete-90d","rule_table":"api_tokens",`
	equal(t, "nothing inactive", out.Take(), `{"level":"DEBUG","msg":"lastseen: rule: nothing inactive",`+common+
		`"acted":0,"batches":0,"retries":0,"cutoff":"2026-03-01T09:30:00Z","stopped":false}`+"\n")
	must(t, db.Create(ruleTokens()).Error)
	job(ctx)
	equal(t, "a run", out.Take(), `{"level":"INFO","msg":"lastseen: rule",`+common+
		`"acted":7,"batches":1,"retries":0,"cutoff":"2026-03-01T09:30:00Z","stopped":false}`+"\n")
	held, err := internals(p).Buffer.LockRule(ctx, "delete-90d")
	must(t, err)
	defer held.Release(ctx)
	job(ctx)
	equal(t, "skipped", out.Take(), `{"level":"DEBUG","msg":"lastseen: rule skipped: another instance holds the lock",`+common+
		`"acted":0,"batches":0,"retries":0,"cutoff":"0001-01-01T00:00:00Z","stopped":false}`+"\n")
}

func mustSpec(t *testing.T, spec string) cron.Schedule {
	t.Helper()
	s, err := cron.ParseStandard(spec)
	must(t, err)
	return s
}

// TestRuleManifest: the buffer's manifest records each rule for the
// lastseen command: its table, key, columns and encodings, soft delete,
// After, Where, whether the app's Action runs, and its batch size.
func TestRuleManifest(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	cfg := h.config()
	cfg.Sessions.Disabled = true
	cfg.Rules = []lastseen.Rule{
		{Name: "warn", Model: &apiToken{}, Field: "LastUsedAt", After: 80 * 24 * time.Hour, Where: "warned_at IS NULL",
			Action: func(*gorm.DB, []any) error { return nil }, BatchSize: 200},
		{Name: "devices", Model: &unixDevice{}, Field: "LastSeen", After: time.Hour, CreatedField: "-"},
	}
	p, _ := h.plugin(cfg)
	m, err := h.r.Client.HGet(context.Background(), p.Config().Buffer.Prefix+":manifest", "rules").Result()
	must(t, err)
	equal(t, "rules", m, `[{"name":"warn","table":"api_tokens","id_column":"id","key":"unsigned","column":"last_used_at","encoding":"time",`+
		`"created_column":"created_at","created_encoding":"time","soft_delete":"deleted_at","after":"1920h0m0s","where":"warned_at IS NULL","action":"app","batch":200},`+
		`{"name":"devices","table":"unix_devices","id_column":"id","key":"text","column":"last_seen","encoding":"unix","after":"1h0m0s","action":"delete","batch":1000}]`)
}

// TestRuleBufferUnreadable: when the tracker's buffer cannot be read, the
// batch acts on no row (logged), and the run goes on with the next batch.
// The rule lives in a plugin without Redis, its model's activity in one
// with Redis, which fails during batch 1 only.
func TestRuleBufferUnreadable(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	var out testenv.Logs
	db := h.openDB()
	must(t, db.AutoMigrate(&apiToken{}, &lastseen.User{}))
	must(t, db.Create(ruleTokens()).Error)
	uc := h.config()
	uc.Redis, uc.Logger, uc.Sessions.Disabled, uc.Buffer.Prefix = nil, testenv.JSONLogger(&out), true, "users"
	uc.Rules = []lastseen.Rule{{Name: "delete-90d", Model: &apiToken{}, Field: "LastUsedAt", After: 90 * 24 * time.Hour, BatchSize: 4, Schedule: "off"}}
	tc := h.config()
	tc.Model, tc.Field, tc.Sessions.Disabled = &apiToken{}, "LastUsedAt", true
	users, tokens := lastseen.New(uc), lastseen.New(tc)
	must(t, db.Use(users))
	must(t, db.Use(tokens))
	t.Cleanup(func() { users.Close(ctx); tokens.Close(ctx) })
	db.Config.NowFunc = h.clock.Now
	seam(users).Purge.AfterSelect = func(_ string, batch int, _ []any) {
		h.r.Mini.SetError(map[int]string{1: "LOADING Redis is loading the dataset in memory"}[batch])
	}
	res, err := users.RunRule(ctx, "delete-90d")
	must(t, err)
	equal(t, "deleted", res.Deleted, 3) // batch 1 (1 2 4 6) none; batch 2 (7 9 10) all
	equal(t, "tokens left", tokenIDs(t, db.Model(&apiToken{})), "[1 2 3 4 5 6]")
	equal(t, "log", out.Take(), `{"level":"WARN","msg":"lastseen: rule: cannot read the activity buffer; this batch acts on no row",`+
		`"plugin":"lastseen:github.com/lastseen/lastseen.User.LastSeenAt","table":"users","prefix":"users","rule":"delete-90d",`+
		`"err":"LOADING Redis is loading the dataset in memory"}`+"\n")
}
