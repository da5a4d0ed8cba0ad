package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A spec asking for a capability the bounding set lacks loses it, and only it; 64-bit
// numbers elsewhere in the spec survive the rewrite exactly.
func TestFixCapsKeepsTheRest(t *testing.T) {
	dir := t.TempDir()
	spec := `{"process":{"capabilities":{"bounding":["CAP_CHOWN","CAP_SYS_RESOURCE"],` +
		`"effective":["CAP_SYS_RESOURCE"]}},"linux":{"resources":{"memory":{"limit":18446744073709551615}}}}`
	path := filepath.Join(dir, "config.json")
	if err := os.WriteFile(path, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	dec := json.NewDecoder(strings.NewReader(spec))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	process := doc["process"].(map[string]any)
	all := ^uint64(0) &^ (1 << 24) // everything but CAP_SYS_RESOURCE
	if !fixCaps(process, all) {
		t.Fatal("expected a change")
	}
	caps := process["capabilities"].(map[string]any)
	if got := caps["bounding"].([]any); len(got) != 1 || got[0] != "CAP_CHOWN" {
		t.Fatalf("bounding = %v", got)
	}
	if got := caps["effective"].([]any); len(got) != 0 {
		t.Fatalf("effective = %v", got)
	}
	if fixCaps(process, ^uint64(0)) {
		t.Fatal("a full bounding set must change nothing")
	}
	out, _ := json.Marshal(doc)
	if !strings.Contains(string(out), "18446744073709551615") {
		t.Fatalf("64-bit number lost: %s", out)
	}
}

func TestCommandSkipsGlobalFlags(t *testing.T) {
	args := []string{"runc", "--root", "/r", "--log=/l", "--systemd-cgroup", "create", "--bundle", "b", "id"}
	if i := command(args); i != 5 {
		t.Fatalf("command index = %d", i)
	}
	if b := flagValue(args[6:], "--bundle", "-b"); b != "b" {
		t.Fatalf("bundle = %q", b)
	}
}
