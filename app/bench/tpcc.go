package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"time"
)

// TPC-C as KV pairs. Every table's primary key is a key, zero-padded so that
// key order is the primary key's order and a district's orders, new orders
// and order lines are contiguous ranges:
//
//	warehouse  w/WWWW                       [tax] name and address
//	  its ytd  w/WWWW/ytd                   [ytd]
//	district   w/WWWW/d/DD                  [tax] name and address
//	  its ytd  w/WWWW/d/DD/ytd              [ytd]
//	  next id  w/WWWW/d/DD/next             [next_o_id]
//	customer   w/WWWW/d/DD/c/CCCCC          [balance, ytd_payment, payment_cnt, delivery_cnt, discount, bad_credit] data
//	by name    w/WWWW/d/DD/cl/LAST/CCCCC    (index, empty row)
//	history    w/WWWW/h/RUN/TTT/SSSSSSSSSS  [c_id, c_d, c_w, d, amount] data
//	order      w/WWWW/d/DD/o/OOOOOOOO       [c_id, entry_d, carrier_id, ol_cnt, all_local]
//	by cust.   w/WWWW/d/DD/co/CCCCC/OOOOOOOO (index, empty row)
//	new_order  w/WWWW/d/DD/no/OOOOOOOO      (empty row)
//	order_line w/WWWW/d/DD/ol/OOOOOOOO/NN   [i_id, supply_w, delivery_d, qty, amount] dist_info
//	item       i/IIIIII                     [price, im_id] data
//	stock      w/WWWW/s/IIIIII              [qty, ytd, order_cnt, remote_cnt] dist_01..10 + data
//
// The warehouse and district rows are partitioned vertically (TPC-C 5.11
// clause 1.6 allows it; it is what column families do in a KV-backed SQL
// database): the columns one transaction updates are keys of their own, so
// that a Payment adding to W_YTD and D_YTD does not invalidate a concurrent
// NewOrder that read W_TAX and D_TAX and took D_NEXT_O_ID. Every read is
// still validated at commit (serializable); only false sharing is gone.
//
// Money is in cents, rates in basis points. Deviations from TPC-C 5.11,
// to keep loading a matter of seconds on a laptop: Items (default 10,000,
// not 100,000) and Customers per district (default 300, not 3,000; the
// initial orders per district follow it); no think or keying times.
const (
	districts   = 10
	newOrderPct = 30 // of the initial orders per district that are undelivered
)

func wKey(w int) string        { return fmt.Sprintf("w/%04d", w) }
func wYTDKey(w int) string     { return fmt.Sprintf("w/%04d/ytd", w) }
func dKey(w, d int) string     { return fmt.Sprintf("w/%04d/d/%02d", w, d) }
func dYTDKey(w, d int) string  { return fmt.Sprintf("w/%04d/d/%02d/ytd", w, d) }
func dNextKey(w, d int) string { return fmt.Sprintf("w/%04d/d/%02d/next", w, d) }
func cKey(w, d, c int) string  { return fmt.Sprintf("w/%04d/d/%02d/c/%05d", w, d, c) }
func clPrefix(w, d int, last string) string {
	return fmt.Sprintf("w/%04d/d/%02d/cl/%s/", w, d, last)
}
func clKey(w, d int, last string, c int) string {
	return fmt.Sprintf("%s%05d", clPrefix(w, d, last), c)
}
func hKey(w int, run string, t, seq int) string {
	return fmt.Sprintf("w/%04d/h/%s/%03d/%010d", w, run, t, seq)
}
func oKey(w, d, o int) string     { return fmt.Sprintf("w/%04d/d/%02d/o/%08d", w, d, o) }
func coPrefix(w, d, c int) string { return fmt.Sprintf("w/%04d/d/%02d/co/%05d/", w, d, c) }
func coKey(w, d, c, o int) string { return fmt.Sprintf("%s%08d", coPrefix(w, d, c), o) }
func noPrefix(w, d int) string    { return fmt.Sprintf("w/%04d/d/%02d/no/", w, d) }
func noKey(w, d, o int) string    { return fmt.Sprintf("%s%08d", noPrefix(w, d), o) }
func olPrefix(w, d, o int) string { return fmt.Sprintf("w/%04d/d/%02d/ol/%08d/", w, d, o) }
func olKey(w, d, o, n int) string { return fmt.Sprintf("%s%02d", olPrefix(w, d, o), n) }
func iKey(i int) string           { return fmt.Sprintf("i/%06d", i) }
func sKey(w, i int) string        { return fmt.Sprintf("w/%04d/s/%06d", w, i) }

// tpccKey is a parsed TPC-C key.
type tpccKey struct {
	table   string // warehouse, warehouse_ytd, district, district_ytd, district_next, customer, cust_name, history, order, cust_order, new_order, order_line, item, stock, other
	w, d    int
	c, o, n int
	i       int
	last    string
}

// parseTPCCKey parses a key made by the functions above.
func parseTPCCKey(k string) (tpccKey, error) {
	p := keyParts(k)
	num := func(s string) (int, error) { return strconv.Atoi(s) }
	bad := func() (tpccKey, error) { return tpccKey{table: "other"}, fmt.Errorf("not a TPC-C key: %q", k) }
	var out tpccKey
	var err error
	switch {
	case len(p) == 2 && p[0] == "i":
		out.table = "item"
		out.i, err = num(p[1])
	case len(p) >= 2 && p[0] == "w":
		if out.w, err = num(p[1]); err != nil {
			return bad()
		}
		switch {
		case len(p) == 2:
			out.table = "warehouse"
		case len(p) == 3 && p[2] == "ytd":
			out.table = "warehouse_ytd"
		case len(p) == 4 && p[2] == "s":
			out.table = "stock"
			out.i, err = num(p[3])
		case len(p) == 6 && p[2] == "h":
			out.table = "history"
		case len(p) >= 4 && p[2] == "d":
			if out.d, err = num(p[3]); err != nil {
				return bad()
			}
			switch {
			case len(p) == 4:
				out.table = "district"
			case len(p) == 5 && p[4] == "ytd":
				out.table = "district_ytd"
			case len(p) == 5 && p[4] == "next":
				out.table = "district_next"
			case len(p) == 6 && p[4] == "c":
				out.table = "customer"
				out.c, err = num(p[5])
			case len(p) == 7 && p[4] == "cl":
				out.table, out.last = "cust_name", p[5]
				out.c, err = num(p[6])
			case len(p) == 6 && p[4] == "o":
				out.table = "order"
				out.o, err = num(p[5])
			case len(p) == 7 && p[4] == "co":
				out.table = "cust_order"
				if out.c, err = num(p[5]); err == nil {
					out.o, err = num(p[6])
				}
			case len(p) == 6 && p[4] == "no":
				out.table = "new_order"
				out.o, err = num(p[5])
			case len(p) == 7 && p[4] == "ol":
				out.table = "order_line"
				if out.o, err = num(p[5]); err == nil {
					out.n, err = num(p[6])
				}
			default:
				return bad()
			}
		default:
			return bad()
		}
	default:
		return bad()
	}
	if err != nil {
		return bad()
	}
	return out, nil
}

// Row field positions.
const (
	wTax, dTax                                          = 0, 0
	ytd, nextOID                                        = 0, 0 // warehouse_ytd, district_ytd; district_next
	cBalance, cYTD, cPayCnt, cDelivCnt, cDiscount, cBad = 0, 1, 2, 3, 4, 5
	oC, oEntry, oCarrier, oOLCnt, oAllLocal             = 0, 1, 2, 3, 4
	olI, olSupplyW, olDelivery, olQty, olAmount         = 0, 1, 2, 3, 4
	iPrice, iIm                                         = 0, 1
	sQty, sYTD, sOrderCnt, sRemoteCnt                   = 0, 1, 2, 3
)

var nFields = map[string]int{
	"warehouse": 1, "warehouse_ytd": 1, "district": 1, "district_ytd": 1, "district_next": 1, "customer": 6, "history": 5, "order": 5,
	"order_line": 5, "item": 2, "stock": 4, "new_order": 0, "cust_order": 0, "cust_name": 0,
	// TPC-B and YCSB rows.
	"account": 2, "teller": 2, "branch": 1, "tpcb_history": 5, "ycsb": 1,
}

var syllables = []string{"BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING"}

// lastName is TPC-C's C_LAST for n in [0, 999] (clause 4.3.2.3).
func lastName(n int) string {
	return syllables[n/100] + syllables[n/10%10] + syllables[n%10]
}

type tpcc struct {
	p WorkloadParams
	// NURand run-time constants C (clause 2.1.6).
	cLast, cID, olIID int
}

func newTPCC(p WorkloadParams) *tpcc {
	r := newRand(p.Seed, 1<<20)
	return &tpcc{p: p, cLast: uniform(r, 0, 255), cID: uniform(r, 0, 1023), olIID: uniform(r, 0, 8191)}
}

func (*tpcc) kinds() []string {
	return []string{"NewOrder", "Payment", "OrderStatus", "Delivery", "StockLevel"}
}

// tpccWeights is the seed's mix (and TPC-C's minimum percentages), in
// the order of kinds().
var tpccWeights = []int{45, 43, 4, 4, 4}

func (t *tpcc) load(ctx context.Context, l *loader) error {
	r := newRand(t.p.Seed, 1<<21)
	now := time.Now().Unix()
	for i := 1; i <= t.p.Items; i++ {
		if err := l.put(iKey(i), row{f: []int64{int64(uniform(r, 100, 10000)), int64(uniform(r, 1, 10000))}, data: randString(r, uniform(r, 26, 50))}.encode()); err != nil {
			return err
		}
	}
	C := t.p.Customers
	for w := 1; w <= t.p.Warehouses; w++ {
		if err := l.put(wKey(w), row{f: []int64{int64(uniform(r, 0, 2000))}, data: randString(r, 40)}.encode()); err != nil {
			return err
		}
		if err := l.put(wYTDKey(w), row{f: []int64{30_000_000}}.encode()); err != nil {
			return err
		}
		for i := 1; i <= t.p.Items; i++ {
			if err := l.put(sKey(w, i), row{f: []int64{int64(uniform(r, 10, 100)), 0, 0, 0}, data: randString(r, 240+uniform(r, 26, 50))}.encode()); err != nil {
				return err
			}
		}
		for d := 1; d <= districts; d++ {
			if err := l.put(dKey(w, d), row{f: []int64{int64(uniform(r, 0, 2000))}, data: randString(r, 40)}.encode()); err != nil {
				return err
			}
			if err := l.put(dYTDKey(w, d), row{f: []int64{3_000_000}}.encode()); err != nil {
				return err
			}
			if err := l.put(dNextKey(w, d), row{f: []int64{int64(C + 1)}}.encode()); err != nil {
				return err
			}
			for c := 1; c <= C; c++ {
				bad := int64(0)
				if r.IntN(10) == 0 {
					bad = 1
				}
				if err := l.put(cKey(w, d, c), row{f: []int64{-1000, 1000, 1, 0, int64(uniform(r, 0, 5000)), bad}, data: randString(r, uniform(r, 300, 500))}.encode()); err != nil {
					return err
				}
				ln := (c - 1) % 1000
				if c > 1000 {
					ln = nuRand(r, 255, t.cLast, 0, 999)
				}
				if err := l.put(clKey(w, d, lastName(ln), c), row{}.encode()); err != nil {
					return err
				}
				if err := l.put(hKey(w, "load", d, c), row{f: []int64{int64(c), int64(d), int64(w), int64(d), 1000}, data: randString(r, 20)}.encode()); err != nil {
					return err
				}
			}
			perm := r.Perm(C)
			firstNew := C - C*newOrderPct/100 + 1
			for o := 1; o <= C; o++ {
				c := perm[o-1] + 1
				olCnt := uniform(r, 5, 15)
				carrier := int64(uniform(r, 1, 10))
				if o >= firstNew {
					carrier = 0
				}
				if err := l.put(oKey(w, d, o), row{f: []int64{int64(c), now, carrier, int64(olCnt), 1}}.encode()); err != nil {
					return err
				}
				if err := l.put(coKey(w, d, c, o), row{}.encode()); err != nil {
					return err
				}
				if o >= firstNew {
					if err := l.put(noKey(w, d, o), row{}.encode()); err != nil {
						return err
					}
				}
				for n := 1; n <= olCnt; n++ {
					amount, deliv := int64(0), now
					if o >= firstNew {
						amount, deliv = int64(uniform(r, 1, 999999)), 0
					}
					if err := l.put(olKey(w, d, o, n), row{f: []int64{int64(uniform(r, 1, t.p.Items)), int64(w), deliv, 5, amount}, data: randString(r, 24)}.encode()); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

type tpccTerminal struct {
	w    *tpcc
	id   int
	r    *rand.Rand
	mix  *mix
	home int
	seq  int
}

func (t *tpcc) terminal(i int, r *rand.Rand) terminal {
	return &tpccTerminal{w: t, id: i, r: r, mix: newMix(t.kinds(), tpccWeights), home: i%t.p.Warehouses + 1}
}

func (t *tpccTerminal) next(ctx context.Context, s *session) (int, error) {
	k := t.mix.pick(t.r)
	var err error
	switch k {
	case 0:
		err = t.newOrder(ctx, s)
	case 1:
		err = t.payment(ctx, s)
	case 2:
		err = t.orderStatus(ctx, s)
	case 3:
		err = t.delivery(ctx, s)
	default:
		err = t.stockLevel(ctx, s)
	}
	return k, err
}

func mustRow(k string, v val, table string) (row, error) {
	if !v.found {
		return row{}, fmt.Errorf("%s %q not found", table, k)
	}
	r, err := decodeRow(v.v, nFields[table])
	if err != nil {
		return row{}, fmt.Errorf("%s %q: %w", table, k, err)
	}
	return r, nil
}

func (t *tpccTerminal) otherWarehouse(w int) int {
	if t.w.p.Warehouses == 1 {
		return w
	}
	o := uniform(t.r, 1, t.w.p.Warehouses-1)
	if o >= w {
		o++
	}
	return o
}

type orderItem struct{ i, supplyW, qty int }

// newOrder is TPC-C 2.4: take the district's next order id, insert the
// order, its new_order and order lines, and update each item's stock.
func (t *tpccTerminal) newOrder(ctx context.Context, s *session) error {
	p := t.w.p
	w, d := t.home, uniform(t.r, 1, districts)
	c := nuRand(t.r, 1023, t.w.cID, 1, p.Customers)
	n := uniform(t.r, 5, 15)
	rollback := uniform(t.r, 1, 100) == 1
	items := make([]orderItem, 0, n)
	seen := map[[2]int]bool{}
	allLocal := int64(1)
	for len(items) < n {
		it := orderItem{i: nuRand(t.r, 8191, t.w.olIID, 1, p.Items), supplyW: w, qty: uniform(t.r, 1, 10)}
		if uniform(t.r, 1, 100) == 1 {
			it.supplyW = t.otherWarehouse(w)
		}
		if seen[[2]int{it.i, it.supplyW}] {
			continue
		}
		seen[[2]int{it.i, it.supplyW}] = true
		if it.supplyW != w {
			allLocal = 0
		}
		items = append(items, it)
	}
	if rollback {
		items[n-1].i = p.Items + 1 // an unused item: the transaction rolls back
	}
	now := time.Now().Unix()
	return s.run(ctx, readWrite, func(ctx context.Context, tx *tx) error {
		const first = 4 // keys before the items'
		keys := []string{wKey(w), dKey(w, d), dNextKey(w, d), cKey(w, d, c)}
		for _, it := range items {
			keys = append(keys, iKey(it.i), sKey(it.supplyW, it.i))
		}
		vs, err := tx.get(ctx, keys...)
		if err != nil {
			return err
		}
		for j := range items {
			if !vs[first+2*j].found {
				return errRollback
			}
		}
		if _, err := mustRow(keys[0], vs[0], "warehouse"); err != nil {
			return err
		}
		if _, err := mustRow(keys[1], vs[1], "district"); err != nil {
			return err
		}
		nr, err := mustRow(keys[2], vs[2], "district_next")
		if err != nil {
			return err
		}
		if _, err := mustRow(keys[3], vs[3], "customer"); err != nil {
			return err
		}
		o := int(nr.f[nextOID])
		nr.f[nextOID]++
		tx.put(keys[2], nr.encode())
		tx.put(oKey(w, d, o), row{f: []int64{int64(c), now, 0, int64(n), allLocal}}.encode())
		tx.put(noKey(w, d, o), row{}.encode())
		tx.put(coKey(w, d, c, o), row{}.encode())
		for j, it := range items {
			ir, err := mustRow(keys[first+2*j], vs[first+2*j], "item")
			if err != nil {
				return err
			}
			sr, err := mustRow(keys[first+1+2*j], vs[first+1+2*j], "stock")
			if err != nil {
				return err
			}
			q := int64(it.qty)
			if sr.f[sQty] >= q+10 {
				sr.f[sQty] -= q
			} else {
				sr.f[sQty] += 91 - q
			}
			sr.f[sYTD] += q
			sr.f[sOrderCnt]++
			if it.supplyW != w {
				sr.f[sRemoteCnt]++
			}
			tx.put(keys[first+1+2*j], sr.encode())
			tx.put(olKey(w, d, o, j+1), row{f: []int64{int64(it.i), int64(it.supplyW), 0, q, q * ir.f[iPrice]}, data: sr.data[:24]}.encode())
		}
		return nil
	})
}

// customerByName picks the middle customer with a last name (2.5.2.2).
func customerByName(ctx context.Context, tx *tx, w, d int, last string) (int, error) {
	kvs, err := tx.scan(ctx, clPrefix(w, d, last), prefixEnd(clPrefix(w, d, last)), 0)
	if err != nil {
		return 0, err
	}
	if len(kvs) == 0 {
		return 0, nil
	}
	k, err := parseTPCCKey(kvs[(len(kvs)-1)/2].key)
	if err != nil {
		return 0, err
	}
	return k.c, nil
}

// pickCustomer returns a customer id, or a last name to look up (60%).
func (t *tpccTerminal) pickCustomer() (c int, last string) {
	C := t.w.p.Customers
	if uniform(t.r, 1, 100) <= 60 {
		return 0, lastName(nuRand(t.r, 255, t.w.cLast, 0, min(999, C-1)))
	}
	return nuRand(t.r, 1023, t.w.cID, 1, C), ""
}

func (t *tpccTerminal) resolveCustomer(ctx context.Context, tx *tx, w, d, c int, last string) (int, error) {
	if last == "" {
		return c, nil
	}
	id, err := customerByName(ctx, tx, w, d, last)
	if err != nil {
		return 0, err
	}
	if id == 0 { // no such name at this scale: fall back to an id
		id = 1 + int(fnv64(uint64(len(last)))%uint64(t.w.p.Customers))
	}
	return id, nil
}

// payment is TPC-C 2.5: add the amount to the warehouse's and district's
// year-to-date, take it from the customer's balance, insert a history row.
func (t *tpccTerminal) payment(ctx context.Context, s *session) error {
	w, d := t.home, uniform(t.r, 1, districts)
	cw, cd := w, d
	if uniform(t.r, 1, 100) > 85 && t.w.p.Warehouses > 1 {
		cw, cd = t.otherWarehouse(w), uniform(t.r, 1, districts)
	}
	cid, last := t.pickCustomer()
	h := int64(uniform(t.r, 100, 500000))
	t.seq++
	hk := hKey(w, t.w.p.RunID, t.id, t.seq)
	return s.run(ctx, readWrite, func(ctx context.Context, tx *tx) error {
		c, err := t.resolveCustomer(ctx, tx, cw, cd, cid, last)
		if err != nil {
			return err
		}
		keys := []string{wKey(w), dKey(w, d), wYTDKey(w), dYTDKey(w, d), cKey(cw, cd, c)}
		vs, err := tx.get(ctx, keys...)
		if err != nil {
			return err
		}
		// W_NAME and D_NAME go into H_DATA: the static rows are read.
		if _, err := mustRow(keys[0], vs[0], "warehouse"); err != nil {
			return err
		}
		if _, err := mustRow(keys[1], vs[1], "district"); err != nil {
			return err
		}
		wr, err := mustRow(keys[2], vs[2], "warehouse_ytd")
		if err != nil {
			return err
		}
		dr, err := mustRow(keys[3], vs[3], "district_ytd")
		if err != nil {
			return err
		}
		cr, err := mustRow(keys[4], vs[4], "customer")
		if err != nil {
			return err
		}
		wr.f[ytd] += h
		dr.f[ytd] += h
		cr.f[cBalance] -= h
		cr.f[cYTD] += h
		cr.f[cPayCnt]++
		if cr.f[cBad] == 1 {
			info := fmt.Sprintf("%d %d %d %d %d %d|", c, cd, cw, d, w, h)
			data := append([]byte(info), cr.data...)
			cr.data = data[:min(len(data), 500)]
		}
		tx.put(keys[2], wr.encode())
		tx.put(keys[3], dr.encode())
		tx.put(keys[4], cr.encode())
		tx.put(hk, row{f: []int64{int64(c), int64(cd), int64(cw), int64(d), h}, data: []byte("payment history row")}.encode())
		return nil
	})
}

// orderStatus is TPC-C 2.6: a customer's last order and its lines. Its
// reads are validated (serializable read-only).
func (t *tpccTerminal) orderStatus(ctx context.Context, s *session) error {
	w, d := t.home, uniform(t.r, 1, districts)
	cid, last := t.pickCustomer()
	return s.run(ctx, readOnlyValidated, func(ctx context.Context, tx *tx) error {
		c, err := t.resolveCustomer(ctx, tx, w, d, cid, last)
		if err != nil {
			return err
		}
		vs, err := tx.get(ctx, cKey(w, d, c))
		if err != nil {
			return err
		}
		if _, err := mustRow(cKey(w, d, c), vs[0], "customer"); err != nil {
			return err
		}
		orders, err := tx.scan(ctx, coPrefix(w, d, c), prefixEnd(coPrefix(w, d, c)), 0)
		if err != nil || len(orders) == 0 {
			return err
		}
		k, err := parseTPCCKey(orders[len(orders)-1].key)
		if err != nil {
			return err
		}
		ov, err := tx.get(ctx, oKey(w, d, k.o))
		if err != nil {
			return err
		}
		if _, err := mustRow(oKey(w, d, k.o), ov[0], "order"); err != nil {
			return err
		}
		_, err = tx.scan(ctx, olPrefix(w, d, k.o), prefixEnd(olPrefix(w, d, k.o)), 0)
		return err
	})
}

// delivery is TPC-C 2.7 (in one transaction, as the spec allows): deliver
// the oldest undelivered order of every district. The ten districts are
// read together, so an attempt takes four round trips, not forty.
func (t *tpccTerminal) delivery(ctx context.Context, s *session) error {
	w := t.home
	carrier := int64(uniform(t.r, 1, 10))
	now := time.Now().Unix()
	return s.run(ctx, readWrite, func(ctx context.Context, tx *tx) error {
		rs := make([]scanRange, districts)
		for d := 1; d <= districts; d++ {
			rs[d-1] = scanRange{noPrefix(w, d), prefixEnd(noPrefix(w, d)), 1}
		}
		nos, err := tx.scanMany(ctx, rs)
		if err != nil {
			return err
		}
		var ds, os []int
		var oKeys []string
		for d := 1; d <= districts; d++ {
			if len(nos[d-1]) == 0 {
				continue
			}
			k, err := parseTPCCKey(nos[d-1][0].key)
			if err != nil {
				return err
			}
			ds, os = append(ds, d), append(os, k.o)
			oKeys = append(oKeys, oKey(w, d, k.o))
		}
		if len(ds) == 0 {
			return nil
		}
		ovs, err := tx.get(ctx, oKeys...)
		if err != nil {
			return err
		}
		orders := make([]row, len(ds))
		cKeys := make([]string, len(ds))
		lrs := make([]scanRange, len(ds))
		for j, d := range ds {
			if orders[j], err = mustRow(oKeys[j], ovs[j], "order"); err != nil {
				return err
			}
			cKeys[j] = cKey(w, d, int(orders[j].f[oC]))
			lrs[j] = scanRange{olPrefix(w, d, os[j]), prefixEnd(olPrefix(w, d, os[j])), 0}
		}
		lines, err := tx.scanMany(ctx, lrs)
		if err != nil {
			return err
		}
		cvs, err := tx.get(ctx, cKeys...)
		if err != nil {
			return err
		}
		for j, d := range ds {
			sum := int64(0)
			for _, l := range lines[j] {
				lr, err := mustRow(l.key, l.val, "order_line")
				if err != nil {
					return err
				}
				sum += lr.f[olAmount]
				lr.f[olDelivery] = now
				tx.put(l.key, lr.encode())
			}
			cr, err := mustRow(cKeys[j], cvs[j], "customer")
			if err != nil {
				return err
			}
			cr.f[cBalance] += sum
			cr.f[cDelivCnt]++
			orders[j].f[oCarrier] = carrier
			tx.put(oKeys[j], orders[j].encode())
			tx.put(cKeys[j], cr.encode())
			tx.del(noKey(w, d, os[j]))
		}
		return nil
	})
}

// stockLevel is TPC-C 2.8: how many items of the district's last 20
// orders are below a threshold. It runs at read committed, as the spec
// allows (2.8.2.3): no validation.
func (t *tpccTerminal) stockLevel(ctx context.Context, s *session) error {
	w, d := t.home, 1+t.id%districts
	threshold := int64(uniform(t.r, 10, 20))
	return s.run(ctx, readOnly, func(ctx context.Context, tx *tx) error {
		dv, err := tx.get(ctx, dNextKey(w, d))
		if err != nil {
			return err
		}
		dr, err := mustRow(dNextKey(w, d), dv[0], "district_next")
		if err != nil {
			return err
		}
		next := int(dr.f[nextOID])
		lines, err := tx.scan(ctx, olKey(w, d, max(1, next-20), 0), olKey(w, d, next, 0), 0)
		if err != nil {
			return err
		}
		ids := map[int]bool{}
		for _, l := range lines {
			lr, err := mustRow(l.key, l.val, "order_line")
			if err != nil {
				return err
			}
			ids[int(lr.f[olI])] = true
		}
		keys := make([]string, 0, len(ids))
		for i := range ids {
			keys = append(keys, sKey(w, i))
		}
		sort.Strings(keys)
		ss, err := tx.get(ctx, keys...)
		if err != nil {
			return err
		}
		low := 0
		for j, sv := range ss {
			sr, err := mustRow(keys[j], sv, "stock")
			if err != nil {
				return err
			}
			if sr.f[sQty] < threshold {
				low++
			}
		}
		_ = low // the answer is shown to nobody; the reads are the work
		return nil
	})
}

// tpccChecker checks TPC-C's consistency conditions 1-4 (clause 3.3.2)
// and that every district's orders are exactly 1..D_NEXT_O_ID-1.
type tpccChecker struct {
	bad     []string
	wYTD    map[int]int64
	dYTDSum map[int]int64
	dNext   map[[2]int]int64
	orders  map[[2]int]*distOrders
}

type distOrders struct {
	count, maxO, sumOL    int64
	noCount, noMin, noMax int64
	olCount               int64
}

func (*tpcc) checker() checker {
	return &tpccChecker{wYTD: map[int]int64{}, dYTDSum: map[int]int64{}, dNext: map[[2]int]int64{}, orders: map[[2]int]*distOrders{}}
}

func (c *tpccChecker) dist(w, d int) *distOrders {
	o := c.orders[[2]int{w, d}]
	if o == nil {
		o = &distOrders{}
		c.orders[[2]int{w, d}] = o
	}
	return o
}

func (c *tpccChecker) add(key string, value []byte) {
	if key == "bench/loaded" {
		return
	}
	k, err := parseTPCCKey(key)
	if err != nil {
		c.bad = append(c.bad, err.Error())
		return
	}
	r, err := decodeRow(value, nFields[k.table])
	if err != nil {
		c.bad = append(c.bad, fmt.Sprintf("%s %s: %v", k.table, key, err))
		return
	}
	switch k.table {
	case "warehouse_ytd":
		c.wYTD[k.w] = r.f[ytd]
	case "district_ytd":
		c.dYTDSum[k.w] += r.f[ytd]
	case "district_next":
		c.dNext[[2]int{k.w, k.d}] = r.f[nextOID]
	case "order":
		o := c.dist(k.w, k.d)
		o.count++
		o.maxO = max(o.maxO, int64(k.o))
		o.sumOL += r.f[oOLCnt]
	case "new_order":
		o := c.dist(k.w, k.d)
		if o.noCount == 0 || int64(k.o) < o.noMin {
			o.noMin = int64(k.o)
		}
		o.noMax = max(o.noMax, int64(k.o))
		o.noCount++
	case "order_line":
		c.dist(k.w, k.d).olCount++
	}
}

func (c *tpccChecker) violations() []string {
	out := append([]string(nil), c.bad...)
	ws := sortedKeys(c.wYTD)
	for _, w := range ws {
		if c.wYTD[w] != c.dYTDSum[w] {
			out = append(out, fmt.Sprintf("condition 1: warehouse %d W_YTD %d != sum(D_YTD) %d", w, c.wYTD[w], c.dYTDSum[w]))
		}
	}
	dists := make([][2]int, 0, len(c.dNext))
	for k := range c.dNext {
		dists = append(dists, k)
	}
	sort.Slice(dists, func(i, j int) bool {
		return dists[i][0] < dists[j][0] || dists[i][0] == dists[j][0] && dists[i][1] < dists[j][1]
	})
	if len(ws) == 0 {
		out = append(out, "no warehouse rows")
	}
	for _, wd := range dists {
		next := c.dNext[wd]
		o := c.dist(wd[0], wd[1])
		name := fmt.Sprintf("district %d/%d", wd[0], wd[1])
		if next-1 != o.maxO {
			out = append(out, fmt.Sprintf("condition 2: %s D_NEXT_O_ID-1 = %d != max(O_ID) %d", name, next-1, o.maxO))
		}
		if o.noCount > 0 && o.noMax != next-1 {
			out = append(out, fmt.Sprintf("condition 2: %s D_NEXT_O_ID-1 = %d != max(NO_O_ID) %d", name, next-1, o.noMax))
		}
		if o.noCount > 0 && o.noCount != o.noMax-o.noMin+1 {
			out = append(out, fmt.Sprintf("condition 3: %s %d new orders != max-min+1 = %d", name, o.noCount, o.noMax-o.noMin+1))
		}
		if o.sumOL != o.olCount {
			out = append(out, fmt.Sprintf("condition 4: %s sum(O_OL_CNT) %d != order lines %d", name, o.sumOL, o.olCount))
		}
		if o.count != next-1 {
			out = append(out, fmt.Sprintf("orders: %s has %d orders, D_NEXT_O_ID-1 = %d", name, o.count, next-1))
		}
	}
	return out
}

func sortedKeys[V any](m map[int]V) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}
