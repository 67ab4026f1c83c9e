package main

import (
	"reflect"
	"strconv"
	"sync"

	"github.com/alecthomas/kong"
	"github.com/lastseen/lastseen"
	"gorm.io/gorm/schema"
)

// flagVars are the flag defaults, taken from the library so that they
// cannot drift: its Default* values, and the table and column names GORM
// gives its default models lastseen.User and lastseen.Session. Flags use
// them as ${name} in their default tags.
func flagVars() kong.Vars {
	user := parseModel(&lastseen.User{})
	session := parseModel(&lastseen.Session{})
	def := lastseen.New(lastseen.Config{}).Config() // the library's defaults
	return kong.Vars{
		"default_shards":            strconv.Itoa(lastseen.DefaultShards),
		"default_batch_size":        strconv.Itoa(lastseen.DefaultBatchSize),
		"default_purge_batch_size":  strconv.Itoa(def.Sessions.BatchSize),
		"default_throttle":          lastseen.DefaultThrottle.String(),
		"default_flush_concurrency": strconv.Itoa(def.Flush.Concurrency),
		"default_users_table":       user.Table,
		"default_user_id_column":    user.PrioritizedPrimaryField.DBName,
		"default_user_id_type":      idType(user.PrioritizedPrimaryField),
		"default_last_seen_column":  user.LookUpField(def.Field).DBName,
		"default_sessions_table":    session.Table,
		"default_session_id_column": session.PrioritizedPrimaryField.DBName,
		"default_session_id_type":   idType(session.PrioritizedPrimaryField),
		"default_expires_column":    session.LookUpField(def.Sessions.ExpiresField).DBName,
		"default_active_column":     session.LookUpField(def.Sessions.ActiveField).DBName,
	}
}

// parseModel parses one of the library's models with GORM's default
// naming; they are fixed, so an error is a bug.
func parseModel(model any) *schema.Schema {
	s, err := schema.Parse(model, &sync.Map{}, schema.NamingStrategy{})
	if err != nil {
		panic("lastseen: parse " + reflect.TypeOf(model).String() + ": " + err.Error())
	}
	return s
}

// idType is the --*-id-type of a primary key field: "string" for text,
// "int" otherwise.
func idType(f *schema.Field) string {
	if f.FieldType.Kind() == reflect.String {
		return "string"
	}
	return "int"
}
