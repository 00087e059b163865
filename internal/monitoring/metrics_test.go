package monitoring

import (
	"regexp"
	"slices"
	"strings"
)

// Metric types.
const (
	counter   = "counter"
	gauge     = "gauge"
	histogram = "histogram"
)

// knownMetric is one metric a walship service exports: its name as
// registered (histograms without _bucket/_sum/_count), its type and the
// labels the service sets on it (target labels such as job, instance and
// namespace are added by Prometheus and not listed).
type knownMetric struct {
	Name   string
	Type   string
	Labels []string
}

// knownMetrics lists every metric the rules and the dashboard may use. Keep
// it in step with the services' registries: one line per metric.
var knownMetrics = []knownMetric{
	// Primary.
	{"walship_commits_total", counter, []string{"durability", "replication", "result"}},
	{"walship_commit_duration_seconds", histogram, []string{"durability", "replication"}},
	{"walship_wal_written_bytes_total", counter, nil},
	{"walship_wal_records_total", counter, nil},
	{"walship_wal_batches_total", counter, nil},
	{"walship_wal_last_lsn", gauge, nil},
	{"walship_wal_durable_lsn", gauge, nil},
	{"walship_visible_lsn", gauge, nil},
	{"walship_wal_size_bytes", gauge, nil},
	{"walship_wal_retention_limit_bytes", gauge, nil},
	{"walship_replication_lag_seconds", gauge, []string{"replica", "stage"}},
	{"walship_replication_lag_bytes", gauge, []string{"replica", "stage"}},
	{"walship_replication_lag_records", gauge, []string{"replica", "stage"}},
	{"walship_replication_connected_replicas", gauge, nil},
	{"walship_replication_replica_connected", gauge, []string{"replica"}},
	{"walship_replication_sent_bytes_total", counter, []string{"replica"}},
	{"walship_replication_paced_bytes_total", counter, []string{"replica"}},
	{"walship_replication_paced_seconds_total", counter, []string{"replica"}},
	{"walship_ship_delays_total", counter, []string{"to"}},
	{"walship_replication_out_of_range_total", counter, nil},
	{"walship_replication_diverged_total", counter, nil},
	{"walship_replication_snapshots_sent_total", counter, nil},
	{"walship_primary_snapshot_uploads_total", counter, []string{"result"}},
	{"walship_primary_snapshot_upload_duration_seconds", histogram, nil},
	{"walship_replication_logstore_acked_lsn", gauge, []string{"logstore"}},
	{"walship_replication_logstore_lag_records", gauge, []string{"logstore"}},
	{"walship_replication_logstore_connected", gauge, []string{"logstore"}},
	{"walship_replication_logstore_lag_seconds", gauge, []string{"logstore"}},
	{"walship_replication_logstore_lag_bytes", gauge, []string{"logstore"}},
	{"walship_primary_taking_writes", gauge, nil},
	{"walship_primary_refused_writes_total", counter, []string{"reason"}},
	{"walship_primary_election_waits_total", counter, []string{"outcome"}},
	{"walship_membership_change_in_progress", gauge, nil},
	{"walship_membership_changes_total", counter, []string{"outcome"}},
	{"walship_primary_contract_sync_replicas", gauge, nil},
	{"walship_write_inflight_bytes", gauge, nil},
	{"walship_write_refusals_total", counter, []string{"limit"}},
	{"walship_write_quota_throttle_seconds_total", counter, []string{"identity"}},
	{"walship_watch_watchers", gauge, nil},
	{"walship_watch_cutoffs_total", counter, []string{"reason"}},
	{"walship_watch_sent_transactions_total", counter, nil},
	{"walship_watch_ring_oldest_lsn", gauge, nil},
	{"walship_sync_commits_waiting", gauge, []string{"peers", "stage"}},
	{"walship_codec_encode_duration_seconds", histogram, []string{"codec"}},
	{"walship_archive_lsn", gauge, nil},
	{"walship_archive_lag_seconds", gauge, nil},
	{"walship_archive_lag_bytes", gauge, nil},

	// Primary, replicas and log stores.
	{"walship_wal_fsync_duration_seconds", histogram, nil},
	{"walship_wal_fsync_errors_total", counter, nil},
	{"walship_fences_granted_total", counter, nil},
	{"walship_orphaned_records_total", counter, nil},
	{"walship_cluster_mismatch_total", counter, nil},
	{"walship_node_role", gauge, []string{"role"}},
	{"walship_epoch", gauge, nil},
	{"walship_election_held", gauge, nil},
	{"walship_election_primary_alive", gauge, nil},
	{"walship_election_paused", gauge, nil},
	{"walship_election_term", gauge, nil},
	{"walship_election_contending", gauge, nil},
	{"walship_promotions_total", counter, []string{"result"}},
	{"walship_step_downs_total", counter, nil},
	{"walship_promotion_phase_duration_seconds", histogram, []string{"phase"}},
	{"walship_server_info", gauge, []string{"grpc_address", "id"}},
	{"walship_tls_reloads_total", counter, []string{"result"}},
	{"walship_tls_cert_expiry_timestamp_seconds", gauge, nil},
	{"walship_tls_ca_expiry_timestamp_seconds", gauge, nil},
	{"walship_tls_last_reload_success", gauge, nil},
	{"walship_server_refusals_total", counter, []string{"limit"}},
	{"walship_tls_crl_next_update_timestamp_seconds", gauge, nil},
	{"walship_authz_policy_reloads_total", counter, []string{"result"}},
	{"walship_authz_denied_total", counter, []string{"class", "method"}},

	// Replica.
	{"walship_replica_lag_seconds", gauge, nil},
	{"walship_replica_lsn", gauge, []string{"stage"}},
	{"walship_replica_applied_records_total", counter, nil},
	{"walship_replica_applied_bytes_total", counter, nil},
	{"walship_replica_catchup_rung", gauge, []string{"rung"}},
	{"walship_replica_catchup_paced_seconds_total", counter, nil},
	{"walship_replica_connected", gauge, nil},
	{"walship_replica_refused_batches_total", counter, []string{"reason"}},
	{"walship_replica_diverged_total", counter, nil},
	{"walship_replica_unapplied_bytes", gauge, nil},
	{"walship_replica_spilled_batches_total", counter, nil},
	{"walship_codec_decode_duration_seconds", histogram, []string{"codec"}},
	{"walship_replica_archive_batches_total", counter, nil},
	{"walship_replica_archive_reseeds_total", counter, nil},
	{"walship_replica_archive_errors_total", counter, nil},

	// Log store.
	{"walship_logstore_durable_lsn", gauge, nil},
	{"walship_logstore_first_lsn", gauge, nil},
	{"walship_logstore_stored_bytes", gauge, nil},
	{"walship_logstore_epoch", gauge, nil},
	{"walship_logstore_appended_bytes_total", counter, nil},
	{"walship_logstore_read_bytes_total", counter, nil},
	{"walship_logstore_fsync_duration_seconds", histogram, nil},
	{"walship_logstore_append_streams", gauge, nil},
	{"walship_logstore_read_streams", gauge, nil},
	{"walship_logstore_refilling", gauge, nil},
	{"walship_logstore_refill_batches_total", counter, nil},
	{"walship_logstore_refill_bytes_total", counter, nil},
	{"walship_logstore_snapshots", gauge, nil},
	{"walship_logstore_snapshot_bytes", gauge, nil},
	{"walship_logstore_snapshot_puts_total", counter, []string{"result"}},
	{"walship_logstore_snapshots_served_total", counter, nil},
	{"walship_logstore_snapshot_sent_bytes_total", counter, nil},
	{"walship_logstore_retention_held_bytes", gauge, nil},
	{"walship_logstore_archived_lsn", gauge, nil},
	{"walship_logstore_refill_archive_batches_total", counter, nil},
	{"walship_archive_uploader", gauge, nil},
	{"walship_archive_chunks_uploaded_total", counter, nil},
	{"walship_archive_uploaded_bytes_total", counter, nil},
	{"walship_archive_snapshots_uploaded_total", counter, nil},
	{"walship_archive_upload_errors_total", counter, nil},
	{"walship_archive_deleted_objects_total", counter, nil},
	{"walship_archive_chunk_upload_duration_seconds", histogram, nil},
}

// lookupMetric finds a known metric by registered name.
func lookupMetric(name string) (knownMetric, bool) {
	i := slices.IndexFunc(knownMetrics, func(m knownMetric) bool { return m.Name == name })
	if i < 0 {
		return knownMetric{}, false
	}
	return knownMetrics[i], true
}

// metricRef is one walship_* series name used in a PromQL expression.
type metricRef struct {
	Series   string // as written, e.g. walship_commit_duration_seconds_bucket
	Selector string // the {...} following it, "" if none
}

// walshipToken matches a walship_* metric name and the label matchers that
// follow it. Recording rules (walship:...) do not match.
var walshipToken = regexp.MustCompile(`\bwalship_[a-zA-Z0-9_]*(\{[^}]*\})?`)

// metricRefs returns the walship_* series used in expr.
func metricRefs(expr string) []metricRef {
	var refs []metricRef
	for _, m := range walshipToken.FindAllStringSubmatchIndex(expr, -1) {
		ref := metricRef{Series: expr[m[0]:m[1]]}
		if m[2] >= 0 {
			ref.Series = expr[m[0]:m[2]]
			ref.Selector = expr[m[2]:m[3]]
		}
		refs = append(refs, ref)
	}
	return refs
}

// resolveMetric maps a series name to the known metric it belongs to:
// histograms are used through their _bucket, _sum and _count series.
// It returns a problem description, or "" when the series is fine.
func resolveMetric(series string) (knownMetric, string) {
	if m, ok := lookupMetric(series); ok {
		if m.Type == histogram {
			return m, "histogram " + series + " used without _bucket, _sum or _count"
		}
		return m, ""
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(series, suffix)
		if !ok {
			continue
		}
		if m, ok := lookupMetric(base); ok {
			if m.Type != histogram {
				return m, series + ": " + base + " is a " + m.Type + ", not a histogram"
			}
			return m, ""
		}
	}
	return knownMetric{}, series + " is not in knownMetrics"
}
