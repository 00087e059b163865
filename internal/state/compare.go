package state

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
)

// Reader is read access to a key-value state. [Store], [View] and [Overlay]
// implement it.
type Reader interface {
	// Get returns the value and version of key, ok false if it is absent.
	Get(key []byte) (value []byte, version uint64, ok bool)
}

// Target is the property of a key a [Compare] examines.
type Target uint8

// Targets. The zero value is invalid so that a Compare with the field left
// unset fails [Compare.Validate] instead of silently meaning something.
const (
	// TargetValue compares the key's value bytewise (lexicographically).
	TargetValue Target = iota + 1
	// TargetVersion compares the key's version: the commit LSN of the
	// transaction that last wrote it (the LSN of the commit record ending
	// that transaction, as returned to its writer), 0 if the key is absent.
	TargetVersion
	// TargetExists compares whether the key is present.
	TargetExists
)

// String returns the target's lower-case name.
func (t Target) String() string {
	switch t {
	case TargetValue:
		return "value"
	case TargetVersion:
		return "version"
	case TargetExists:
		return "exists"
	default:
		return fmt.Sprintf("target(%d)", uint8(t))
	}
}

// CompareOp is the relation a [Compare] checks between the key's actual
// property (left) and the Compare's operand (right).
type CompareOp uint8

// Comparison operators. The zero value is invalid, as for [Target].
const (
	// Equal holds when actual == operand.
	Equal CompareOp = iota + 1
	// NotEqual holds when actual != operand.
	NotEqual
	// Less holds when actual < operand.
	Less
	// Greater holds when actual > operand.
	Greater
)

// String returns the operator's lower-case name.
func (o CompareOp) String() string {
	switch o {
	case Equal:
		return "equal"
	case NotEqual:
		return "not_equal"
	case Less:
		return "less"
	case Greater:
		return "greater"
	default:
		return fmt.Sprintf("compare_op(%d)", uint8(o))
	}
}

// ErrInvalidCompare is wrapped by [Compare.Validate] errors.
var ErrInvalidCompare = errors.New("state: invalid compare")

// Compare is one guard of a mini-transaction, in etcd's model: "the Target
// of Key is Result-related to the operand", where the operand is Value,
// Version or Exists according to Target.
//
// Missing keys: their version is 0 and compares like any other version, and
// Exists is false. A missing key has no value, so a TargetValue compare on
// it holds only for NotEqual ("the value is not X" is true of a key with no
// value); Equal, Less and Greater are false. This deliberately differs from
// treating a missing value as empty: Equal to "" must not succeed on a key
// that does not exist — test existence with TargetExists.
type Compare struct {
	Key     []byte
	Target  Target
	Result  CompareOp
	Value   []byte // operand for TargetValue
	Version uint64 // operand for TargetVersion
	Exists  bool   // operand for TargetExists; only Equal and NotEqual apply
}

// Validate reports whether c can be evaluated: Target and Result are known,
// and a TargetExists compare uses Equal or NotEqual.
func (c Compare) Validate() error {
	switch c.Target {
	case TargetValue, TargetVersion:
	case TargetExists:
		if c.Result != Equal && c.Result != NotEqual {
			return fmt.Errorf("%w: %v compare cannot use %v", ErrInvalidCompare, c.Target, c.Result)
		}
	default:
		return fmt.Errorf("%w: unknown %v", ErrInvalidCompare, c.Target)
	}
	switch c.Result {
	case Equal, NotEqual, Less, Greater:
		return nil
	default:
		return fmt.Errorf("%w: unknown %v", ErrInvalidCompare, c.Result)
	}
}

// Eval reports whether c holds in r. An invalid c (see [Compare.Validate])
// never holds; callers should validate compares when accepting them so that
// a malformed request is an error rather than a failed guard.
func (c Compare) Eval(r Reader) bool {
	if c.Validate() != nil {
		return false
	}
	value, version, ok := r.Get(c.Key)
	switch c.Target {
	case TargetValue:
		if !ok {
			return c.Result == NotEqual
		}
		return c.Result.holds(bytes.Compare(value, c.Value))
	case TargetVersion:
		return c.Result.holds(cmp.Compare(version, c.Version))
	default: // TargetExists, Validate allowed Equal and NotEqual only
		return (ok == c.Exists) == (c.Result == Equal)
	}
}

// holds maps a three-way comparison result (actual vs operand) to o.
func (o CompareOp) holds(c int) bool {
	switch o {
	case Equal:
		return c == 0
	case NotEqual:
		return c != 0
	case Less:
		return c < 0
	default: // Greater
		return c > 0
	}
}
