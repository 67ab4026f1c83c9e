package lastseen

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/buffer/redisbuf"
	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/idcodec"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
)

// The buffer knows what it belongs to. Its manifest, the hash
// "<prefix>:manifest", records the layout and the target of the buffer
// under that prefix: written by the first instance that uses the prefix,
// checked by every later one at Initialize. An instance whose Shards,
// dialect, database, table, column or key type differ refuses to start
// (ErrInvalidConfig) instead of writing into a buffer it reads differently.
//
// With Config.Prefix empty the prefix itself names the target, so two apps
// never share a buffer by accident:
//
//	lastseen:<table>:<first 8 hex digits of SHA-256 of dialect, server, database, table, column>
//
// server and database come from the dialect (Dialect.Identity): PostgreSQL's
// system identifier and current_database().current_schema(); MySQL's
// server_uuid (MariaDB: server_id, hostname and port) and DATABASE();
// SQLite's main file, by absolute path. The manifest records all of them;
// a different server alone is logged, not refused, so that a failover to a
// server of another identity does not stop an app with an explicit Prefix.
// The Redis buffer stores the manifest (redisbuf.Buffer.Manifest); the
// plugin decides what it must say and what a disagreement means.

// identityTimeout bounds the identity queries of Initialize.
const identityTimeout = 5 * time.Second

// manifestKey is the manifest's key: a single key, in one Redis Cluster slot.
func manifestKey(prefix string) string { return keys.Manifest(prefix) }

// derivePrefix is the default Prefix for a target: DefaultPrefix, the table
// (without braces, which are Redis Cluster hash tags) and the first 8 hex
// digits of the SHA-256 of the dialect, the server, the database, the table
// and the column, separated by NUL bytes.
func derivePrefix(dialectName string, id dialect.Identity, table, column string) string {
	sum := sha256.Sum256([]byte(strings.Join([]string{dialectName, id.Server, id.Database, table, column}, "\x00")))
	return DefaultPrefix + ":" + strings.NewReplacer("{", "", "}", "").Replace(table) + ":" + hex.EncodeToString(sum[:4])
}

// manifestField is one field of the manifest: its name in the hash, how an
// error names it, and this instance's value.
type manifestField struct {
	name, label, value string
}

// comparedFields is how many of the manifest's first fields must agree
// for an instance to use the buffer: format to shards.
const comparedFields = 7

// manifest returns this instance's manifest layout, in the order the check
// compares it. The server, the throttle window and the model are recorded
// but not compared: with an explicit Prefix, a failover to a server of
// another identity must not stop the app, and a rolling deploy may change
// Throttle (instances whose windows differ do not see each other's throttle
// windows, which are named by their ends: they write more often, nothing
// is lost); a mismatch of the first two is logged.
func (p *Plugin) manifest() []manifestField {
	key := "text"
	if p.users.ids.Integer() {
		key = "integer"
	}
	return []manifestField{
		{"format", "format version", redisbuf.Format},
		{"dialect", "dialect", p.dialect.Name()},
		{"database", "database", p.target.Database},
		{"table", "table", p.users.model.table},
		{"column", "column", p.users.model.time.DBName},
		{"key", "key type", key},
		{"shards", "Shards", strconv.Itoa(p.cfg.Shards)},
		{"server", "server", p.target.Server},
		{"throttle", "Throttle", p.cfg.Throttle.String()},
		{"model", "Model", p.users.model.typ.String()},
	}
}

// manifestSettings are the app's rules the operator tools read from the
// manifest to act as the app does: kept current by every instance at
// start (the last one started wins), never compared. Their names and
// values are the manifest format's; "" is an unset rule.
func (p *Plugin) manifestSettings() []string {
	m, c := p.users.model, p.cfg
	loc := manifestZone(m.enc.Location(), p.now())
	kind := map[idcodec.Kind]string{idcodec.Signed: "signed", idcodec.Unsigned: "unsigned"}[p.users.ids.Kind]
	kv := []string{
		"id_column", m.pk.DBName,
		"key_kind", cmp.Or(kind, "text"),
		"encoding", m.enc.Encoding().String(),
		"location", loc,
		"upsert", strconv.FormatBool(c.WriteMode == upsert),
		"batch", strconv.Itoa(c.BatchSize),
		"on_batch", strconv.FormatBool(c.OnBatch != nil),
		"rules", p.rulesManifest(), // every instance's, with or without rules: the last started wins
	}
	s := p.sessions
	if c.DisablePurge || s == nil { // an instance without sessions (a worker) leaves the rule of those with
		return kv
	}
	rule := map[string]string{
		"sessions_table": s.model.table, "sessions_id_column": s.model.pk.DBName,
		"sessions_key": keyKind(s.model.pk), "expires_column": s.model.time.DBName,
		"expires_encoding": s.model.enc.Encoding().String(),
		"idle_timeout":     c.IdleTimeout.String(), "sessions_batch": strconv.Itoa(c.PurgeBatchSize),
	}
	if s.active != nil {
		rule["active_column"], rule["active_encoding"] = s.active.DBName, s.activeEnc.Encoding().String()
	}
	for _, name := range []string{"sessions_table", "sessions_id_column", "sessions_key", "expires_column",
		"expires_encoding", "idle_timeout", "active_column", "active_encoding", "sessions_batch"} {
		kv = append(kv, name, rule[name])
	}
	return kv
}

// keyKind is the manifest's kind of a primary key: "signed" or
// "unsigned" for Go integer kinds, else "text".
func keyKind(f *schema.Field) string {
	t := f.FieldType
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "signed"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "unsigned"
	}
	return "text"
}

// resolvePrefix reads the database's identity and, when Config.Prefix is
// empty, derives the prefix from it (Initialize, before the tracker is
// built on the prefix). Without the identity an empty Prefix cannot be
// derived: that is an error; with a Prefix set it is logged and the first
// flush reads the identity and checks the manifest.
func (p *Plugin) resolvePrefix(db *gorm.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), identityTimeout)
	defer cancel()
	id, err := p.dialect.Identity(ctx, db)
	switch {
	case err != nil && p.cfg.Prefix == "":
		return fmt.Errorf("lastseen: derive the default Buffer.Prefix: read the database server's identity: %w", err)
	case err != nil:
		p.log.Warn("lastseen: cannot read the database server's identity at start; the first flush checks the buffer's manifest", "err", err)
		return nil
	}
	p.target, p.identityOK = id, true
	if p.cfg.Prefix == "" {
		p.cfg.Prefix = derivePrefix(p.dialect.Name(), id, p.users.model.table, p.users.model.time.DBName)
	}
	return nil
}

// checkManifest creates the manifest if absent (redisbuf.Buffer.Manifest,
// atomic) and compares it with this instance's. A disagreement is an ErrInvalidConfig
// that names both values and the way out; a Redis error is returned as is;
// a different server or Throttle is logged once per value. A flush that
// finds the manifest gone calls it again (restoreManifest). Called with
// manifestMu held, or from Initialize.
func (p *Plugin) checkManifest(ctx context.Context) error {
	want := p.manifest()
	fields := make([]string, 0, 2*len(want))
	for _, f := range want {
		fields = append(fields, f.name, f.value)
	}
	key := manifestKey(p.cfg.Prefix)
	got, err := p.rbuf.Manifest(ctx, fields, comparedFields, p.manifestSettings())
	if err != nil {
		return fmt.Errorf("lastseen: buffer manifest %s: %w", key, err)
	}
	for _, f := range want {
		have := got[f.name]
		switch {
		case have == f.value, f.name == "model":
		case p.warnedManifest(f.name, have):
		case f.name == "server":
			p.log.Warn("lastseen: the buffer was created for another database server; touches of both go to this instance's table",
				"prefix", p.cfg.Prefix, "manifest_server", have, "server", f.value)
		case f.name == "throttle":
			p.log.Warn("lastseen: the buffer was created with another Throttle; instances whose Throttle differs do not see each other's throttle windows and write more often (nothing is lost)",
				"prefix", p.cfg.Prefix, "manifest_throttle", have, "throttle", f.value)
		case f.name == "format":
			return invalid("the buffer at prefix %q was written by a lastseen version of buffer format %s, this version "+
				"writes format %s: flush it empty with the version that wrote it (lastseen flush), delete the key %s, "+
				"then start this version; or set another Buffer.Prefix", p.cfg.Prefix, have, f.value, key)
		case f.name == "shards":
			return invalid("the buffer at prefix %q was created with Buffer.Shards %s, this instance has Buffer.Shards %s: "+
				"set Buffer.Shards: %s, or flush the buffer empty with Buffer.Shards %s and delete the key %s",
				p.cfg.Prefix, have, f.value, have, have, key)
		default:
			return invalid("the buffer at prefix %q was created for %s %q, this instance has %s %q: "+
				"set another Buffer.Prefix (or leave Buffer.Prefix empty to derive one from the database and table), "+
				"or flush the buffer empty with the old setting and delete the key %s",
				p.cfg.Prefix, f.label, have, f.label, f.value, key)
		}
	}
	p.manifestOK.Store(true)
	return nil
}

// checkRedis is Initialize's look at Redis through buf, within one second:
// PING, the eviction policy (refused under RequireNoEviction when it can
// evict) and the manifest. An unreachable Redis is logged and not an error.
// Without Redis (the in-process buffer, one process's own) there is nothing
// to check.
func (p *Plugin) checkRedis(buf buffer.Buffer) error {
	rb, ok := buf.(*redisbuf.Buffer)
	if !ok { // the in-process buffer: nothing shared, nothing evicted
		return nil
	}
	p.rbuf, p.eviction = rb, rb.Eviction()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := buf.Ping(ctx); err != nil {
		p.log.Warn("lastseen: redis unreachable at start; touches are kept in memory until it is back", "err", err)
		return nil
	}
	p.eviction.Check(ctx)
	if policy, risk := p.eviction.State(); risk && p.cfg.RequireNoEviction {
		return invalid("Redis maxmemory-policy is %q, which can evict the buffer, and Buffer.RequireNoEviction is set: "+
			"run CONFIG SET maxmemory-policy noeviction on the Redis (on every master of a cluster), "+
			"or give lastseen a Redis of its own", policy)
	}
	if !p.identityOK {
		return nil
	}
	if err := p.checkManifest(ctx); err != nil {
		if errors.Is(err, ErrInvalidConfig) {
			return err
		}
		p.log.Warn("lastseen: cannot check the buffer's manifest at start; the first flush checks it", "err", err)
	}
	return nil
}

// warnedManifest reports whether the mismatch of a logged-only manifest
// field (server, throttle) with the value have was logged already, and
// marks it logged. Under manifestMu, or from Initialize.
func (p *Plugin) warnedManifest(field, have string) bool {
	if field != "server" && field != "throttle" {
		return false
	}
	key := field + "=" + have
	if p.manifestWarned[key] {
		return true
	}
	if p.manifestWarned == nil {
		p.manifestWarned = map[string]bool{}
	}
	p.manifestWarned[key] = true
	return false
}

// recheckRedis runs at the start of every flush: the eviction check when it
// is due (redisbuf.EvictionWatch), and, until one succeeded, the manifest check that
// Initialize could not do (Redis unreachable, or the database's identity
// unreadable then). Its error (a disagreeing manifest, Redis or the
// database failing) stops the flush before it writes.
func (p *Plugin) recheckRedis(ctx context.Context) error {
	p.eviction.MaybeCheck(ctx)
	if p.rbuf == nil || p.manifestOK.Load() {
		return nil
	}
	p.manifestMu.Lock()
	defer p.manifestMu.Unlock()
	if !p.identityOK {
		id, err := p.dialect.Identity(ctx, p.db)
		if err != nil {
			return fmt.Errorf("lastseen: read the database server's identity for the buffer's manifest: %w", err)
		}
		p.target, p.identityOK = id, true
	}
	return p.checkManifest(ctx)
}

// restoreManifest runs after a flush found which shards have work
// (Buffer.Active, whose pipeline also asks whether the manifest exists):
// when Redis lost its data (a restart without persistence, FLUSHALL), the
// manifest is created again, with this instance's layout, before an
// instance of another layout could claim the prefix; a manifest another
// instance recreated first is compared as at start. No extra round trip
// while the manifest is there.
func (p *Plugin) restoreManifest(ctx context.Context) error {
	if p.rbuf == nil || !p.rbuf.ManifestGone() || !p.manifestOK.Load() {
		return nil
	}
	p.manifestMu.Lock()
	defer p.manifestMu.Unlock()
	p.log.Warn("lastseen: the buffer's manifest is gone (Redis lost its data?); writing it again", "key", manifestKey(p.cfg.Prefix))
	return p.checkManifest(ctx) // writing it marks it present again (Manifest), whatever it says
}

// manifestZone is how the operator tools load the app's column location:
// "" for nil (the driver's location), else its IANA name (for time.Local,
// GORM's default NowFunc on PostgreSQL in an app run with
// TZ=Europe/Berlin, the zone TZ or /etc/localtime names:
// timecol.ZoneName), else, for a zone without DST (time.FixedZone), its
// offset as "+01:00", else the location's own name ("Local" for a local
// zone with no name found), which the tools refuse for a naive column
// rather than take their own zone for the app's.
func manifestZone(loc *time.Location, now time.Time) string {
	if loc == nil {
		return ""
	}
	if name, ok := timecol.ZoneName(loc, now); ok {
		return name
	}
	if !timecol.HasDST(loc, now) {
		return now.In(loc).Format("-07:00")
	}
	return loc.String()
}
