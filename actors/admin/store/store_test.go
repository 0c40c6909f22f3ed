package store_test

import (
	"errors"
	"testing"

	"github.com/tlgate/tlgate/actors/admin/store"
	"github.com/tlgate/tlgate/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func TestDecodeTable(t *testing.T) {
	cases := []struct {
		body  string
		epoch uint64
		ok    bool
	}{
		{`{"epoch":3,"routes":[{"model":"a"}]}`, 3, true},
		{`{"epoch":0,"routes":[]}`, 0, true},
		{``, 0, false},
		{`{"routes":[]}`, 0, false},
		{`{"epoch":-1,"routes":[]}`, 0, false},
		{`{"epoch":1,"routes":[{"model":""}]}`, 0, false},
		{`{"epoch":1,"routes":[{"model":"a"},{"model":"a"}]}`, 0, false},
		{`[1]`, 0, false},
	}
	for _, c := range cases {
		epoch, _, err := store.DecodeTable([]byte(c.body))
		if c.ok != (err == nil) || c.ok && epoch != c.epoch {
			t.Errorf("DecodeTable(%s) = %d, %v; want ok=%v epoch %d", c.body, epoch, err, c.ok, c.epoch)
		}
		if err != nil && !errors.Is(err, store.ErrInvalidTable) {
			t.Errorf("DecodeTable(%s): %v does not wrap ErrInvalidTable", c.body, err)
		}
	}
}
