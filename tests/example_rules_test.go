package tests_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
)

const day = 24 * time.Hour

// AccessToken is an API token that is revoked after 90 days without use,
// with a warning to its owner at 80.
type AccessToken struct {
	ID         int64 `gorm:"primaryKey"`
	OwnerID    int64
	LastUsedAt *time.Time // tracked: the token's last use
	CreatedAt  time.Time  // stands for the last use of a token never used
	WarnedAt   *time.Time // set by the warning, cleared when the token is used again
	RevokedAt  *time.Time // set by the revocation; the auth layer refuses revoked tokens
}

// TokenWarning is the app's outbox: a mail job per warned token, written
// in the rule's transaction and sent by the app's mailer.
type TokenWarning struct {
	ID      int64 `gorm:"primaryKey"`
	TokenID int64
	OwnerID int64
}

// warnOwners is the warning rule's Action: in the batch's transaction it
// queues one mail per token and marks the tokens warned, which takes them
// out of the rule (its Where: warned_at IS NULL).
func warnOwners(tx *gorm.DB, ids []any) error {
	var tokens []AccessToken
	if err := tx.Where("id IN ?", ids).Find(&tokens).Error; err != nil {
		return err
	}
	for _, t := range tokens {
		if err := tx.Create(&TokenWarning{TokenID: t.ID, OwnerID: t.OwnerID}).Error; err != nil {
			return err
		}
	}
	return tx.Model(&AccessToken{}).Where("id IN ?", ids).Update("warned_at", tx.NowFunc()).Error
}

// revokeTokens is the revocation rule's Action: revoked tokens leave the
// rule (its Where: revoked_at IS NULL).
func revokeTokens(tx *gorm.DB, ids []any) error {
	return tx.Model(&AccessToken{}).Where("id IN ?", ids).Update("revoked_at", tx.NowFunc()).Error
}

// clearWarning is the tokens' Flush.OnBatch: a token used again after its
// warning is warned again after its next 80 days without use.
func clearWarning(tx *gorm.DB, batch []lastseen.Seen) error {
	return tx.Model(&AccessToken{}).Where("id IN ? AND warned_at IS NOT NULL", lastseen.SeenIDs[int64](batch)).
		Update("warned_at", nil).Error
}

// API tokens unused for 90 days are revoked, with a warning to their
// owner at 80 days; a token never used counts from its creation. The rules
// run on their Schedule (hourly by default); here by hand.
func Example_revokeUnusedTokens() {
	db, rdb, done := exampleEnv()
	defer done()
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	db.Config.NowFunc = clock
	db.AutoMigrate(&AccessToken{}, &TokenWarning{})
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	db.Create([]AccessToken{
		{ID: 1, OwnerID: 10, LastUsedAt: ago(85 * day), CreatedAt: *ago(400 * day)},
		{ID: 2, OwnerID: 10, LastUsedAt: ago(95 * day), CreatedAt: *ago(400 * day)},
		{ID: 3, OwnerID: 11, LastUsedAt: ago(day), CreatedAt: *ago(400 * day)},
		{ID: 4, OwnerID: 12, CreatedAt: *ago(100 * day)}, // never used
	})

	tokens := lastseen.New(lastseen.Config{
		Redis:  rdb,
		Model:  &AccessToken{},
		Field:  "LastUsedAt",
		Logger: slog.New(slog.DiscardHandler),
		Buffer: lastseen.BufferConfig{Prefix: "app:tokens"},
		Flush:  lastseen.FlushConfig{OnBatch: clearWarning, Schedule: "off"},
		Rules: []lastseen.Rule{
			{Name: "warn-unused-tokens", After: 80 * day, Where: "warned_at IS NULL AND revoked_at IS NULL", Action: warnOwners, Schedule: "off"},
			{Name: "revoke-unused-tokens", After: 90 * day, Where: "revoked_at IS NULL", Action: revokeTokens, Schedule: "off"},
		},
		Sessions: lastseen.SessionConfig{Disabled: true},
		Test:     lastseen.TestConfig{Now: clock},
	})
	if err := db.Use(tokens); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	var soon []int64
	db.Model(&AccessToken{}).Scopes(lastseen.Inactive("revoke-unused-tokens")).Order("id").Pluck("id", &soon)
	fmt.Println("unused for 90 days:", soon)

	for _, rule := range []string{"warn-unused-tokens", "revoke-unused-tokens"} {
		res, err := tokens.RunRule(ctx, rule)
		fmt.Println(rule+":", res.Deleted, "tokens, err", err)
	}
	var mails []int64
	db.Model(&TokenWarning{}).Order("token_id").Pluck("token_id", &mails)
	var revoked []int64
	db.Model(&AccessToken{}).Where("revoked_at IS NOT NULL").Order("id").Pluck("id", &revoked)
	fmt.Println("warning mails queued for tokens", mails, "revoked", revoked)

	res, _ := tokens.RunRule(ctx, "warn-unused-tokens") // the next run: nobody is warned twice
	fmt.Println("warned again:", res.Deleted)

	tokens.Touch(ctx, int64(1)) // token 1 is used again
	tokens.Flush(ctx)           // OnBatch clears its warning
	var t1 AccessToken
	db.First(&t1, 1)
	fmt.Println("token 1 warned:", t1.WarnedAt != nil)
	tokens.Close(ctx)
	// Output:
	// unused for 90 days: [2 4]
	// warn-unused-tokens: 3 tokens, err <nil>
	// revoke-unused-tokens: 2 tokens, err <nil>
	// warning mails queued for tokens [1 2 4] revoked [2 4]
	// warned again: 0
	// token 1 warned: false
}

// Member is an app's user, flagged dormant after 90 days away.
type Member struct {
	ID         int64 `gorm:"primaryKey"`
	LastSeenAt *time.Time
	CreatedAt  time.Time
	Dormant    bool `gorm:"not null;default:false"`
}

// flagDormant is the rule's Action: flagged members leave the rule (its
// Where: dormant = false).
func flagDormant(tx *gorm.DB, ids []any) error {
	return tx.Model(&Member{}).Where("id IN ?", ids).Update("dormant", true).Error
}

// unflagReturning is the members' Flush.OnBatch: a dormant member seen
// again is active, in the transaction that writes the visit.
func unflagReturning(tx *gorm.DB, batch []lastseen.Seen) error {
	return tx.Model(&Member{}).Where("id IN ? AND dormant", lastseen.SeenIDs[int64](batch)).Update("dormant", false).Error
}

// Members away for 90 days are flagged dormant, and unflagged when they
// come back. A member whose visit is still in the buffer is not flagged,
// though the table says 100 days away.
func Example_dormantMembers() {
	db, rdb, done := exampleEnv()
	defer done()
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	db.Config.NowFunc = clock
	db.AutoMigrate(&Member{})
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	db.Create([]Member{
		{ID: 1, LastSeenAt: ago(100 * day), CreatedAt: *ago(900 * day)},
		{ID: 2, LastSeenAt: ago(10 * day), CreatedAt: *ago(900 * day)},
		{ID: 3, CreatedAt: *ago(120 * day)}, // signed up, never came
		{ID: 4, LastSeenAt: ago(100 * day), CreatedAt: *ago(900 * day)},
	})

	members := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Model:    &Member{},
		Logger:   slog.New(slog.DiscardHandler),
		Buffer:   lastseen.BufferConfig{Prefix: "app:members"},
		Flush:    lastseen.FlushConfig{OnBatch: unflagReturning, Schedule: "off"},
		Rules:    []lastseen.Rule{{Name: "flag-dormant", After: 90 * day, Where: "dormant = false", Action: flagDormant}},
		Sessions: lastseen.SessionConfig{Disabled: true},
		Test:     lastseen.TestConfig{Now: clock},
	})
	if err := db.Use(members); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	members.Touch(ctx, int64(4)) // member 4 is back, not flushed yet

	dormant := func() []int64 {
		var ids []int64
		db.Model(&Member{}).Where("dormant").Order("id").Pluck("id", &ids)
		return ids
	}
	count, _ := members.DryRunRule(ctx, "flag-dormant")
	fmt.Println("would flag", count.Expired, "kept", count.Kept)
	members.RunRule(ctx, "flag-dormant") // the scheduler runs it hourly
	fmt.Println("dormant:", dormant())

	members.Touch(ctx, int64(1)) // member 1 comes back
	members.Flush(ctx)
	fmt.Println("after the flush:", dormant())
	members.Close(ctx)
	// Output:
	// would flag 2 kept 1
	// dormant: [1 3]
	// after the flush: [3]
}
