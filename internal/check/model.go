// Package check records client histories against a walship cluster and
// checks them for linearizability with porcupine, one register per key.
//
// A history is a list of operations (Put, Get, Delete, compare-and-swap
// Txn), each with the time its call was sent and the time its answer came
// back, on one monotonic clock. Operations whose outcome is unknown — an
// error or a timeout on a write, or, in a history with crashes, a write
// whose policy lets a crash lose it — are recorded as never returning: the
// checker may place them anywhere after their call, or nowhere. A failed
// read says nothing and is dropped. Values written are unique, so a read
// names the write it saw.
//
// The checker is porcupine (github.com/anishathalye/porcupine), partitioned
// by key: linearizability is a local property, so a history is
// linearizable if and only if every key's is. On a violation it writes
// porcupine's HTML visualisation, which shows the longest linearizable
// prefix of each key and the operation that cannot follow it.
package check

import (
	"fmt"
	"hash/maphash"
	"sort"

	"github.com/anishathalye/porcupine"
)

// Kind is the kind of an operation.
type Kind uint8

// The operations of the register model.
const (
	KindPut Kind = iota + 1
	KindGet
	KindDelete
	// KindCAS is a Txn: if the key holds Expect (or is absent, when
	// ExpectAbsent), put Value.
	KindCAS
)

func (k Kind) String() string {
	switch k {
	case KindPut:
		return "put"
	case KindGet:
		return "get"
	case KindDelete:
		return "delete"
	case KindCAS:
		return "cas"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Input is what an operation asked.
type Input struct {
	Kind         Kind   `json:"kind"`
	Key          string `json:"key"`
	Value        string `json:"value,omitempty"`  // put, cas: the value written
	Expect       string `json:"expect,omitempty"` // cas: the value compared
	ExpectAbsent bool   `json:"expect_absent,omitempty"`
}

// Output is what an operation answered. Unknown means the outcome is not
// known (an error, a timeout, a crash): the write may or may not have
// happened, and the checker accepts any state it leads to.
type Output struct {
	Unknown   bool   `json:"unknown,omitempty"`
	Found     bool   `json:"found,omitempty"`     // get: the key was present
	Value     string `json:"value,omitempty"`     // get: its value
	Existed   bool   `json:"existed,omitempty"`   // delete: the key was present
	Succeeded bool   `json:"succeeded,omitempty"` // cas: the compare held
	LSN       uint64 `json:"lsn,omitempty"`       // the commit LSN (writes) or the read's
	Err       string `json:"err,omitempty"`       // why the outcome is unknown
}

// register is one key's state: absent, or holding value.
type register struct {
	present bool
	value   string
}

func (r register) String() string {
	if !r.present {
		return "∅"
	}
	return fmt.Sprintf("%q", r.value)
}

// step applies an operation to a register and says whether its output is
// one the register could have given.
func step(r register, in Input, out Output) (bool, register) {
	switch in.Kind {
	case KindPut:
		return true, register{present: true, value: in.Value}
	case KindDelete:
		if !out.Unknown && out.Existed != r.present {
			return false, r
		}
		return true, register{}
	case KindGet:
		return out.Found == r.present && (!out.Found || out.Value == r.value), r
	case KindCAS:
		holds := (in.ExpectAbsent && !r.present) || (!in.ExpectAbsent && r.present && r.value == in.Expect)
		if !out.Unknown && out.Succeeded != holds {
			return false, r
		}
		if holds {
			return true, register{present: true, value: in.Value}
		}
		return true, r
	}
	return false, r
}

var seed = maphash.MakeSeed()

// Model is the porcupine model: a register per key.
var Model = porcupine.Model{
	Partition: partitionByKey,
	Init:      func() any { return register{} },
	Step: func(state, input, output any) (bool, any) {
		return step(state.(register), input.(Input), output.(Output))
	},
	Equal: func(a, b any) bool { return a.(register) == b.(register) },
	Hash: func(state any) uint64 {
		r := state.(register)
		if !r.present {
			return 0
		}
		return maphash.String(seed, r.value) | 1
	},
	DescribeOperation: func(input, output any) string {
		return describe(input.(Input), output.(Output))
	},
	DescribeState: func(state any) string { return state.(register).String() },
}

func describe(in Input, out Output) string {
	res := ""
	switch {
	case out.Unknown:
		res = "?"
	case in.Kind == KindGet && out.Found:
		res = fmt.Sprintf("%q", out.Value)
	case in.Kind == KindGet:
		res = "∅"
	case in.Kind == KindDelete:
		res = fmt.Sprintf("existed=%v", out.Existed)
	case in.Kind == KindCAS:
		res = fmt.Sprintf("%v", out.Succeeded)
	default:
		res = "ok"
	}
	if out.LSN != 0 {
		res += fmt.Sprintf(" @%d", out.LSN)
	}
	switch in.Kind {
	case KindPut:
		return fmt.Sprintf("put(%s, %q) → %s", in.Key, in.Value, res)
	case KindGet:
		return fmt.Sprintf("get(%s) → %s", in.Key, res)
	case KindDelete:
		return fmt.Sprintf("delete(%s) → %s", in.Key, res)
	case KindCAS:
		exp := fmt.Sprintf("%q", in.Expect)
		if in.ExpectAbsent {
			exp = "∅"
		}
		return fmt.Sprintf("cas(%s, %s → %q) → %s", in.Key, exp, in.Value, res)
	}
	return in.Kind.String()
}

func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(Input).Key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}
