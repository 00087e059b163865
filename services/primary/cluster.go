package primary

import (
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
)

// A primary's cluster id (DataDir/cluster). The cluster's first primary
// makes it; a primary that has none when it starts — a new cluster, or a
// directory older than cluster ids — adopts the one its log stores'
// answers to its fence hold, and makes one if none holds any (or it has
// no log stores). A log store that has an id promises nothing to a fence
// that states none, though: such a primary is deposed if they hold a
// newer epoch (it rejoins as a replica, and adopts its primary's id),
// and otherwise cannot win its epoch. The id is settled after the epoch
// is won and saved before anything of the epoch is written or sent (Run:
// elect, then saveEpoch); every heartbeat, snapshot header and fence
// answer carries it from then on, and a replica, a candidate or a reader
// of another cluster is refused with FAILED_PRECONDITION naming both
// ids, as is a candidate that states none.

// joinCluster settles the primary's cluster id: its own, else the one the
// log stores' answers hold (ids by address), else a new one. Log stores
// that disagree are an error naming them: the primary does not start.
func (s *Server) joinCluster(ids map[string]string) error {
	if s.cluster.ID() != "" {
		return nil
	}
	id, err := datadir.OneClusterID(ids)
	if err != nil {
		return rpcerr.Mismatch("primary %s has no cluster id and its log stores hold several, so it cannot tell which cluster it is of: %v", s.cfg.ID, err)
	}
	how := "adopted from the log stores"
	if id == "" {
		id, how = datadir.NewClusterID(), "made: this primary starts a new cluster"
	}
	if _, err := s.cluster.Adopt(id); err != nil {
		return err
	}
	s.logger.Info("cluster id "+how, "cluster_id", id)
	return nil
}
