// Command runcwrap runs runc after removing what this machine's root may not have from an OCI
// spec: the CAP_SYS_RESOURCE capability, an oom_score_adj below the caller's own, and rlimits
// above the caller's hard limits.
//
// Why: root on the machines this project tests on lacks CAP_SYS_RESOURCE (its bounding set is
// everything else). kind starts every node container `--privileged`, and kube-proxy and CNI
// pods are privileged inside a node, so runc is asked for every capability and fails with
// "unable to apply caps: operation not permitted". Lowering oom_score_adj and raising a hard
// rlimit need that capability too. Installed as docker's default runtime on the host and as
// containerd's runc inside the kind node image; on a machine where root has every capability
// the spec is left as it is, so the wrapper changes nothing there.
//
// The real runc is $RUNCWRAP_RUNC, else /usr/sbin/runc, else /usr/bin/runc.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Global runc flags that take a value (runc --root X --log Y ... <command>).
var globalWithValue = map[string]bool{
	"--root": true, "--log": true, "--log-format": true, "--criu": true, "--rootless": true,
}

func realRunc() string {
	if p := os.Getenv("RUNCWRAP_RUNC"); p != "" {
		return p
	}
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "runc"
}

// command returns the index of runc's subcommand in args (args[0] is the program), or -1.
func command(args []string) int {
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return i
		}
		if globalWithValue[a] {
			i++
		}
	}
	return -1
}

// flagValue returns the value of a command flag (--bundle X, --bundle=X, -b X).
func flagValue(args []string, names ...string) string {
	for i := 0; i < len(args); i++ {
		for _, n := range names {
			if args[i] == n && i+1 < len(args) {
				return args[i+1]
			}
			if strings.HasPrefix(args[i], n+"=") {
				return strings.TrimPrefix(args[i], n+"=")
			}
		}
	}
	return ""
}

// boundingCaps reads this process's bounding set as capability numbers.
func boundingCaps() (uint64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "CapBnd:") {
			return strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "CapBnd:")), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapBnd in /proc/self/status")
}

// Capability numbers by OCI name, for the ones a bounding set may lack.
var capNumbers = map[string]uint{
	"CAP_SYS_RESOURCE": 24, "CAP_SYS_ADMIN": 21, "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17,
	"CAP_SYS_TIME": 25, "CAP_MAC_ADMIN": 33, "CAP_MAC_OVERRIDE": 32, "CAP_SYSLOG": 34,
	"CAP_WAKE_ALARM": 35, "CAP_BLOCK_SUSPEND": 36, "CAP_AUDIT_READ": 37, "CAP_PERFMON": 38,
	"CAP_BPF": 39, "CAP_CHECKPOINT_RESTORE": 40,
}

// fixCaps drops from each capability set the capabilities this process's bounding set lacks.
func fixCaps(process map[string]any, bounding uint64) bool {
	caps, ok := process["capabilities"].(map[string]any)
	if !ok {
		return false
	}
	changed := false
	for set, raw := range caps {
		list, ok := raw.([]any)
		if !ok {
			continue
		}
		kept := list[:0:0]
		for _, c := range list {
			name, _ := c.(string)
			if n, known := capNumbers[name]; known && bounding&(1<<n) == 0 {
				changed = true
				continue
			}
			kept = append(kept, c)
		}
		caps[set] = kept
	}
	return changed
}

// fixOOM raises process.oomScoreAdj to this process's own value when it is lower.
func fixOOM(process map[string]any) bool {
	raw, ok := process["oomScoreAdj"].(json.Number)
	if !ok {
		return false
	}
	want, err := raw.Int64()
	if err != nil {
		return false
	}
	data, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return false
	}
	own, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || want >= own {
		return false
	}
	process["oomScoreAdj"] = json.Number(strconv.FormatInt(own, 10))
	return true
}

var rlimitNumbers = map[string]int{
	"RLIMIT_CORE": 4, "RLIMIT_NOFILE": 7, "RLIMIT_NPROC": 6, "RLIMIT_MEMLOCK": 8,
	"RLIMIT_STACK": 3, "RLIMIT_MSGQUEUE": 12, "RLIMIT_SIGPENDING": 11, "RLIMIT_NICE": 13,
	"RLIMIT_RTPRIO": 14,
}

// fixRlimits lowers each rlimit to this process's hard limit when it asks for more.
func fixRlimits(process map[string]any) bool {
	list, ok := process["rlimits"].([]any)
	if !ok {
		return false
	}
	changed := false
	for _, raw := range list {
		r, ok := raw.(map[string]any)
		if !ok {
			continue
		}
		name, _ := r["type"].(string)
		n, known := rlimitNumbers[name]
		if !known {
			continue
		}
		var own syscall.Rlimit
		if syscall.Getrlimit(n, &own) != nil {
			continue
		}
		for _, key := range []string{"hard", "soft"} {
			v, ok := r[key].(json.Number)
			if !ok {
				continue
			}
			u, err := strconv.ParseUint(string(v), 10, 64)
			if err == nil && u > own.Max {
				r[key] = json.Number(strconv.FormatUint(own.Max, 10))
				changed = true
			}
		}
	}
	return changed
}

// fixFile rewrites an OCI spec (key "process") or process.json (the process itself).
func fixFile(path string, whole bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // keep 64-bit numbers (rlimits, ids) exact
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return err
	}
	process := doc
	if whole {
		p, ok := doc["process"].(map[string]any)
		if !ok {
			return nil
		}
		process = p
	}
	bounding, err := boundingCaps()
	if err != nil {
		return err
	}
	changed := fixCaps(process, bounding)
	changed = fixOOM(process) || changed
	changed = fixRlimits(process) || changed
	if !changed {
		return nil
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp := path + ".runcwrap"
	if err := os.WriteFile(tmp, out, info.Mode().Perm()); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func main() {
	args := os.Args
	if i := command(args); i > 0 {
		rest := args[i+1:]
		var err error
		switch args[i] {
		case "create", "run":
			bundle := flagValue(rest, "--bundle", "-b")
			if bundle == "" {
				bundle = "."
			}
			err = fixFile(filepath.Join(bundle, "config.json"), true)
		case "exec":
			if p := flagValue(rest, "--process", "-p"); p != "" {
				err = fixFile(p, false)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "runcwrap: %v\n", err)
			os.Exit(1)
		}
	}
	real := realRunc()
	if !strings.Contains(real, "/") {
		// exec needs a path; look runc up on PATH, skipping this wrapper.
		self, _ := os.Executable()
		for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
			p := filepath.Join(dir, real)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && p != self {
				real = p
				break
			}
		}
	}
	args[0] = real
	if err := syscall.Exec(real, args, os.Environ()); err != nil {
		fmt.Fprintf(os.Stderr, "runcwrap: exec %s: %v\n", real, err)
		os.Exit(127)
	}
}
