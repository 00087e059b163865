package bench

import (
	"context"
	"slices"
	"sort"
	"sync"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc"
)

// fakeKV is an in-memory KVServiceClient with the primary's Txn semantics
// (compares on version, every write of a commit gets its commit LSN), so
// the workloads' transactions and checkers run without a cluster.
type fakeKV struct {
	walshipv1.KVServiceClient
	mu   sync.Mutex
	lsn  uint64
	m    map[string]val
	keys []string // sorted
}

func newFakeKV() *fakeKV { return &fakeKV{m: map[string]val{}} }

func (f *fakeKV) set(k string, v val) {
	if _, ok := f.m[k]; !ok {
		i, _ := slices.BinarySearch(f.keys, k)
		f.keys = slices.Insert(f.keys, i, k)
	}
	f.m[k] = v
}

func (f *fakeKV) remove(k string) {
	if _, ok := f.m[k]; ok {
		i, _ := slices.BinarySearch(f.keys, k)
		f.keys = slices.Delete(f.keys, i, i+1)
		delete(f.m, k)
	}
}

func (f *fakeKV) Txn(_ context.Context, req *walshipv1.TxnRequest, _ ...grpc.CallOption) (*walshipv1.TxnResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ok := true
	for _, c := range req.Compares {
		if f.m[c.Key].ver != c.GetVersionLsn() {
			ok = false
		}
	}
	ops := req.Success
	if !ok {
		ops = req.Failure
	}
	writes := false
	for _, o := range ops {
		if o.GetGet() == nil {
			writes = true
		}
	}
	if writes {
		f.lsn++
	}
	resp := &walshipv1.TxnResponse{Succeeded: ok, Lsn: f.lsn}
	for _, o := range ops {
		switch x := o.Op.(type) {
		case *walshipv1.TxnOp_Put:
			f.set(x.Put.Key, val{v: slices.Clone(x.Put.Value), ver: f.lsn, found: true})
			resp.Results = append(resp.Results, &walshipv1.TxnOpResult{Result: &walshipv1.TxnOpResult_Put{Put: &walshipv1.PutOpResult{}}})
		case *walshipv1.TxnOp_Delete:
			f.remove(x.Delete.Key)
			resp.Results = append(resp.Results, &walshipv1.TxnOpResult{Result: &walshipv1.TxnOpResult_Delete{Delete: &walshipv1.DeleteOpResult{}}})
		case *walshipv1.TxnOp_Get:
			v := f.m[x.Get.Key]
			resp.Results = append(resp.Results, &walshipv1.TxnOpResult{Result: &walshipv1.TxnOpResult_Get{Get: &walshipv1.GetOpResult{Found: v.found, Value: v.v, VersionLsn: v.ver}}})
		}
	}
	return resp, nil
}

func (f *fakeKV) Put(_ context.Context, req *walshipv1.PutRequest, _ ...grpc.CallOption) (*walshipv1.PutResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lsn++
	f.set(req.Key, val{v: req.Value, ver: f.lsn, found: true})
	return &walshipv1.PutResponse{Lsn: f.lsn}, nil
}

func (f *fakeKV) Get(_ context.Context, req *walshipv1.GetRequest, _ ...grpc.CallOption) (*walshipv1.GetResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := f.m[req.Key]
	return &walshipv1.GetResponse{Found: v.found, Value: v.v, VersionLsn: v.ver, AppliedLsn: f.lsn}, nil
}

func (f *fakeKV) Scan(_ context.Context, req *walshipv1.ScanRequest, _ ...grpc.CallOption) (*walshipv1.ScanResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := sort.SearchStrings(f.keys, req.Start)
	limit := int(req.Limit)
	if limit == 0 {
		limit = 10000
	}
	resp := &walshipv1.ScanResponse{AppliedLsn: f.lsn}
	for ; i < len(f.keys) && (req.End == "" || f.keys[i] < req.End); i++ {
		if len(resp.Kvs) == limit {
			resp.More = true
			break
		}
		v := f.m[f.keys[i]]
		resp.Kvs = append(resp.Kvs, &walshipv1.KeyValue{Key: f.keys[i], Value: v.v, VersionLsn: v.ver})
	}
	return resp, nil
}

// check feeds the whole state to ck.
func (f *fakeKV) check(ck checker) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range f.keys {
		ck.add(k, f.m[k].v)
	}
	return ck.violations()
}

func scanReq(prefix string) *walshipv1.ScanRequest {
	return &walshipv1.ScanRequest{Start: prefix, End: prefixEnd(prefix)}
}

func putReq(k string, v []byte) *walshipv1.PutRequest { return &walshipv1.PutRequest{Key: k, Value: v} }

func clone(f *fakeKV) *fakeKV {
	g := newFakeKV()
	for _, k := range f.keys {
		g.set(k, f.m[k])
	}
	g.lsn = f.lsn
	return g
}
