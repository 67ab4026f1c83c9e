package idcodec

import (
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"testing"
)

// benchUUID is a UUID-like primary key type: sql.Scanner, driver.Valuer and
// fmt.Stringer, as github.com/google/uuid.UUID is.
type benchUUID [16]byte

func (u *benchUUID) Scan(src any) error {
	s, ok := src.(string)
	if !ok || len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return errors.New("not a UUID")
	}
	_, err := hex.Decode(u[:], []byte(s[0:8]+s[9:13]+s[14:18]+s[19:23]+s[24:36]))
	return err
}

func (u benchUUID) Value() (driver.Value, error) { return u.String(), nil }

func (u benchUUID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// BenchmarkNormalizeUserID measures the id normalization every Touch that
// misses the local cache pays (and every flush entry's parse back).
func BenchmarkNormalizeUserID(b *testing.B) {
	type uintUser struct {
		ID uint64 `gorm:"primaryKey"`
	}
	type stringUser struct {
		ID string `gorm:"primaryKey;size:64"`
	}
	type uuidUser struct {
		ID benchUUID `gorm:"primaryKey"`
	}
	codec := func(m any) Codec { return newCodec(b, m) }
	u := benchUUID{0x6b, 0xa7, 0xb8, 0x10, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8}
	for _, c := range []struct {
		name  string
		codec Codec
		id    any
		want  string
	}{
		{"uint64", codec(&uintUser{}), any(uint64(1234567)), "1234567"},
		{"int", codec(&uintUser{}), any(1234567), "1234567"},
		{"decimal-string", codec(&uintUser{}), any("1234567"), "1234567"},
		{"string-key", codec(&stringUser{}), any("user-7f3a9c"), "user-7f3a9c"},
		{"uuid-stringer", codec(&uuidUser{}), any(u), "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
	} {
		b.Run(c.name, func(b *testing.B) {
			if got, err := c.codec.Normalize(c.id); err != nil || got != c.want {
				b.Fatalf("normalize(%v) = %q, %v; want %q", c.id, got, err, c.want)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.codec.Normalize(c.id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
