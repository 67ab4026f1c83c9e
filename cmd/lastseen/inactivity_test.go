package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// cliToken is the token model of the rule tests: soft-deletable, created
// at CreatedAt, warned by the app's Action.
type cliToken struct {
	ID         int64 `gorm:"primaryKey;autoIncrement:false"`
	LastUsedAt *time.Time
	CreatedAt  time.Time
	WarnedAt   *time.Time
	DeletedAt  gorm.DeletedAt
}

// tokenApp is the app of the CLI's rule tests at 2026-03-01T10:00:00Z: a
// users plugin with the session rule, and a tokens plugin with two rules,
// a warning at 80 days (the app's Action) and a delete at 90 (batches of
// 2). Its tokens: 1 used 2025-11-01; 2 never used, created 2025-10-01; 3
// used 2026-02-01 (live); 4 used 2025-11-01 and touched 2026-02-28
// (buffered); 5 used 2025-11-01, warned already.
func tokenApp(t *testing.T, app *gorm.DB, r *testenv.Redis, now func() time.Time) (tokens *lastseen.Plugin) {
	t.Helper()
	at := func(s string) *time.Time { v := mustTime(s); return &v }
	must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}, &cliToken{}))
	created := mustTime("2025-09-01T00:00:00Z")
	must(t, app.Create(&[]cliToken{
		{ID: 1, LastUsedAt: at("2025-11-01T00:00:00Z"), CreatedAt: created},
		{ID: 2, CreatedAt: mustTime("2025-10-01T00:00:00Z")},
		{ID: 3, LastUsedAt: at("2026-02-01T00:00:00Z"), CreatedAt: created},
		{ID: 4, LastUsedAt: at("2025-11-01T00:00:00Z"), CreatedAt: created},
		{ID: 5, LastUsedAt: at("2025-11-01T00:00:00Z"), CreatedAt: created, WarnedAt: at("2026-02-20T00:00:00Z")},
	}).Error)
	users := appConfig(r.Client, "", now)
	must(t, app.Use(lastseen.New(users)))
	cfg := appConfig(r.Client, "", now)
	cfg.Model, cfg.Field, cfg.Sessions.Disabled = &cliToken{}, "LastUsedAt", true
	cfg.Rules = []lastseen.Rule{
		{Name: "warn-80d", After: 80 * 24 * time.Hour, Where: "warned_at IS NULL", Schedule: "off",
			Action: func(tx *gorm.DB, ids []any) error {
				return tx.Model(&cliToken{}).Where("id IN ?", ids).Update("warned_at", now()).Error
			}},
		{Name: "delete-90d", After: 90 * 24 * time.Hour, BatchSize: 2, Schedule: "off"},
	}
	tokens = lastseen.New(cfg)
	must(t, app.Use(tokens))
	prefix := tokens.Config().Buffer.Prefix
	t.Cleanup(func() { testenv.DeleteKeys(context.Background(), r.Client, keys.All(prefix)) })
	_, err := tokens.TouchAt(context.Background(), int64(4), mustTime("2026-02-28T00:00:00Z"))
	must(t, err)
	return tokens
}

// TestCLIRules: status, purge --dry-run and purge cover the app's
// inactivity rules, read from the tokens buffer's manifest: the counts
// are the app's DryRunRule (the buffered 4 kept); the purge deletes by the
// delete rule (soft: the model has a gorm.DeletedAt) and only counts the
// rule whose Action is the app's; --rule picks the buffer, refuses to run
// an Action rule, and takes the rule's lock. The commands leave the
// manifest as the app wrote it.
func TestCLIRules(t *testing.T) {
	forEachOpsEnv(t, func(t *testing.T, d *testenv.DB, r *testenv.Redis, _ string) {
		ctx := context.Background()
		clock := testenv.ClockAt("2026-03-01T10:00:00Z")
		app := d.Open(t)
		tokens := tokenApp(t, app, r, clock.Now)
		app.Config.NowFunc = clock.Now
		manifest := keys.Manifest(tokens.Config().Buffer.Prefix)
		before, err := r.Client.HGetAll(ctx, manifest).Result()
		must(t, err)
		run := func(args ...string) (string, error) {
			t.Helper()
			return runCLI(t, clock.Now, append(append(args, d.Flags()...), "--redis", r.Addr)...)
		}
		warnLine := `rule "warn-80d" (cli_tokens.last_used_at after 80d, the app's Action): `
		deleteLine := `rule "delete-90d" (cli_tokens.last_used_at after 90d, delete): `
		counts := []string{
			warnLine + "2 inactive (and 1 kept: newer activity buffered), oldest activity 2025-10-01T00:00:00Z (3634h0m0s ago)",
			deleteLine + "3 inactive (and 1 kept: newer activity buffered), oldest activity 2025-10-01T00:00:00Z (3634h0m0s ago)",
		}

		out, err := run("status", "--table", "cli_tokens")
		must(t, err)
		ls := lines(out)
		equalLines(t, "status: last lines", fmt.Sprintln(ls[len(ls)-3])+fmt.Sprintln(ls[len(ls)-2])+ls[len(ls)-1],
			append([]string{"expired sessions: the app purges no sessions with this buffer (Sessions.Disabled)"}, counts...))
		out, err = run("purge", "--dry-run", "--table", "cli_tokens")
		must(t, err)
		equalLines(t, "purge --dry-run", out, append([]string{"dry run: nothing changed"}, counts...))
		out, err = run("purge", "--dry-run", "--rule", "warn-80d") // picks the tokens buffer
		must(t, err)
		equalLines(t, "purge --dry-run --rule warn-80d", out, []string{"dry run: nothing changed", counts[0]})
		_, err = run("purge", "--rule", "warn-80d")
		equal(t, "purge --rule warn-80d", fmt.Sprint(err), `lastseen: rule "warn-80d" hands its rows to the app's Action, `+
			`which cannot run here: run it in the app (Plugin.RunRule), or count it with --dry-run`)

		lock := keys.RuleLock(tokens.Config().Buffer.Prefix, "delete-90d")
		must(t, r.Client.Set(ctx, lock, "held", time.Minute).Err())
		out, err = run("purge", "--rule", "delete-90d")
		equal(t, "purge while the app runs the rule", fmt.Sprint(err),
			`lastseen: another instance holds the lock: rule "delete-90d" is running elsewhere; nothing deleted`)
		equalLines(t, "purge while the app runs the rule: stdout", out, []string{deleteLine + "skipped: another instance runs it now"})
		must(t, r.Client.Del(ctx, lock).Err())

		out, err = run("purge", "--table", "cli_tokens")
		must(t, err)
		equalLines(t, "purge", out, []string{
			warnLine + "not run here (the app's Action runs only in the app: Plugin.RunRule); 2 inactive (and 1 kept: newer activity buffered), " +
				"oldest activity 2025-10-01T00:00:00Z (3634h0m0s ago)",
			deleteLine + "deleted 3 in 2 batches, cutoff 2026-03-01T10:00:00Z",
		})
		var left, all []int64
		must(t, app.Model(&cliToken{}).Order("id").Pluck("id", &left).Error)
		must(t, app.Unscoped().Model(&cliToken{}).Order("id").Pluck("id", &all).Error)
		equal(t, "tokens left", fmt.Sprint(left, all), "[3 4] [1 2 3 4 5]")
		var warned int64
		must(t, app.Unscoped().Model(&cliToken{}).Where("warned_at IS NOT NULL").Count(&warned).Error)
		equal(t, "tokens warned", warned, int64(1))

		out, err = run("status", "--table", "cli_tokens", "--json")
		must(t, err)
		var st statusJSON
		must(t, json.Unmarshal([]byte(out), &st))
		b, err := json.Marshal(st.Rules)
		must(t, err)
		equal(t, "status --json: rules", string(b), `[{"name":"warn-80d","table":"cli_tokens","column":"last_used_at","after_seconds":6912000,"action":"app","count":0,"kept":1,"oldest":"2025-11-01T00:00:00Z"},`+
			`{"name":"delete-90d","table":"cli_tokens","column":"last_used_at","after_seconds":7776000,"action":"delete","count":0,"kept":1,"oldest":"2025-11-01T00:00:00Z"}]`)
		after, err := r.Client.HGetAll(ctx, manifest).Result()
		must(t, err)
		equal(t, "manifest after the commands", fmt.Sprint(after), fmt.Sprint(before))
	})
}

// TestCLIRuleNeedsRedis: without Redis there is no manifest to read the
// rules from: --rule is a usage error.
func TestCLIRuleNeedsRedis(t *testing.T) {
	d := testenv.SQLite().New(t)
	_, errOut, code := runExit(t, nil, append([]string{"purge", "--rule", "x"}, d.Flags()...)...)
	equal(t, "exit code", code, exitUsage)
	equal(t, "stderr", errOut, "lastseen: --rule needs --redis: the app's rules are read from its buffer's manifest\n"+
		"run \"lastseen purge --help\" for its flags\n")
}

// TestCLIRuleReadsTheTrackersBuffer: a rule of the users plugin on the
// tokens table, whose activity another plugin's buffer tracks: the purge
// reads that buffer too, as the app's run does, and keeps the token
// touched there (4).
func TestCLIRuleReadsTheTrackersBuffer(t *testing.T) {
	forEachOpsEnv(t, func(t *testing.T, d *testenv.DB, r *testenv.Redis, _ string) {
		clock := testenv.ClockAt("2026-03-01T10:00:00Z")
		app := d.Open(t)
		must(t, app.AutoMigrate(&lastseen.User{}, &lastseen.Session{}, &cliToken{}))
		at := func(s string) *time.Time { v := mustTime(s); return &v }
		must(t, app.Create(&[]cliToken{
			{ID: 1, LastUsedAt: at("2025-11-01T00:00:00Z")}, {ID: 3, LastUsedAt: at("2026-02-01T00:00:00Z")},
			{ID: 4, LastUsedAt: at("2025-11-01T00:00:00Z")},
		}).Error)
		users := appConfig(r.Client, "", clock.Now)
		users.Rules = []lastseen.Rule{{Name: "forget-tokens", Model: &cliToken{}, Field: "LastUsedAt", CreatedField: "-", After: 90 * 24 * time.Hour, Schedule: "off"}}
		up := lastseen.New(users)
		must(t, app.Use(up))
		cfg := appConfig(r.Client, "", clock.Now)
		cfg.Model, cfg.Field, cfg.Sessions.Disabled = &cliToken{}, "LastUsedAt", true
		tokens := lastseen.New(cfg)
		must(t, app.Use(tokens))
		for _, p := range []*lastseen.Plugin{up, tokens} {
			prefix := p.Config().Buffer.Prefix
			t.Cleanup(func() { testenv.DeleteKeys(context.Background(), r.Client, keys.All(prefix)) })
		}
		_, err := tokens.TouchAt(context.Background(), int64(4), mustTime("2026-02-28T00:00:00Z"))
		must(t, err)
		out, err := runCLI(t, clock.Now, append(append([]string{"purge", "--rule", "forget-tokens"}, d.Flags()...), "--redis", r.Addr)...)
		must(t, err)
		equalLines(t, "purge --rule forget-tokens", out, []string{
			`rule "forget-tokens" (cli_tokens.last_used_at after 90d, delete): deleted 1 in 1 batches, cutoff 2026-03-01T10:00:00Z`})
		var left []int64
		must(t, app.Model(&cliToken{}).Order("id").Pluck("id", &left).Error)
		equal(t, "tokens left", fmt.Sprint(left), "[3 4]")
	})
}
