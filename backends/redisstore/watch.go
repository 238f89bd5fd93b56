package redisstore

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-idempotency/idempotency/backends"
	"github.com/watermill-idempotency/idempotency/backends/storekit"
)

var _ backends.Watcher = (*Store)(nil)

// How the subscriptions behind Watch are kept.
const (
	// cmdTimeout bounds a subscription command's write.
	cmdTimeout = 5 * time.Second
	// idleCheck is how long a subscription connection may stay silent
	// before it is pinged, and then how long the pong may take before the
	// connection counts as lost.
	idleCheck = 5 * time.Second
	// After a lost subscription, Watch reports not ok (its callers poll)
	// for a backoff that doubles from minResubscribe to maxResubscribe
	// and starts again at the next subscription confirmed.
	minResubscribe = 100 * time.Millisecond
	maxResubscribe = 10 * time.Second
)

// Watch implements [backends.Watcher] with Redis sharded pub/sub (Redis 7
// and later): Complete, Release and Delete publish to the sharded channel
// named as the key's Redis key, which lives on the key's own Cluster slot.
// The store subscribes to a key's channel while someone watches it, over
// one connection per Redis node (per master of a Cluster), and fans the
// messages out to the key's watches. Watch returns once the server has
// confirmed the subscription and, with one Inspect, that key is still
// held (the subscription itself rides a connection of its own, outside
// the pool).
//
// On a *redis.Ring the store subscribes on the shard that serves the key,
// which is the shard its scripts run on; a Ring whose shards change
// (SetAddrs) may move a key to another shard under a watch, which is then
// woken by nothing, and its caller finds the change by polling, as it
// always does at a slow pace. Watch reports not ok, and its callers poll,
// on a server without sharded pub/sub, and for a moment after a
// subscription connection was lost; losing one wakes every watch it
// served, since it may have missed a change. Call [Store.Close] to end
// the subscriptions.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), bool) {
	channel := s.prefix + key
	sub := s.watch.subscriber(ctx, s.client, channel)
	if sub == nil {
		return nil, func() {}, false
	}
	changed, stop, ok := sub.watch(ctx, channel)
	if !ok {
		return nil, func() {}, false
	}
	// The subscription is confirmed: a change from now on is published to
	// it. One before is seen here, on the server's clock.
	rec, err := s.Inspect(ctx, key)
	switch {
	case errors.Is(err, backends.ErrNotFound) || err == nil && rec.State != backends.StateInProgress:
		stop()
		return closedChan, func() {}, true
	case err != nil:
		stop()
		return nil, func() {}, false
	}
	return changed, stop, true
}

// closedChan is the changed channel of a watch whose key is not held.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Close ends the subscriptions Watch opened and wakes the watches they
// served. The store's other calls keep working; a later Watch reports not
// ok. It does not close the client.
func (s *Store) Close() error {
	s.watch.mu.Lock()
	s.watch.closed = true
	subs := s.watch.nodes
	s.watch.nodes = nil
	s.watch.mu.Unlock()
	for _, sub := range subs {
		sub.close()
	}
	return nil
}

// watchers are a store's subscribers, one per Redis node.
type watchers struct {
	mu     sync.Mutex
	nodes  map[string]*subscriber
	closed bool
}

// subscriber returns the subscriber for the node that serves channel, or
// nil if it cannot tell which node that is.
func (ws *watchers) subscriber(ctx context.Context, client redis.UniversalClient, channel string) *subscriber {
	var (
		addr string
		node interface {
			SSubscribe(context.Context, ...string) *redis.PubSub
		}
	)
	switch c := client.(type) {
	case *redis.ClusterClient:
		master, err := c.MasterForKey(ctx, channel)
		if err != nil {
			return nil
		}
		addr, node = master.Options().Addr, master
	case *redis.Ring:
		shard, err := c.GetShardClientForKey(channel)
		if err != nil {
			return nil
		}
		addr, node = shard.Options().Addr, shard
	case *redis.Client:
		node = c
	default:
		return nil
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		return nil
	}
	sub := ws.nodes[addr]
	if sub == nil {
		sub = &subscriber{node: node, channels: map[string]*subscription{}}
		if ws.nodes == nil {
			ws.nodes = map[string]*subscriber{}
		}
		ws.nodes[addr] = sub
	}
	return sub
}

// subscriber keeps one pub/sub connection to one node and the channels
// subscribed on it. A connection lost is replaced on the next watch after
// a backoff, never resubscribed: its watches were woken, and watch anew.
type subscriber struct {
	node interface {
		SSubscribe(context.Context, ...string) *redis.PubSub
	}

	mu          sync.Mutex
	ps          *redis.PubSub // nil until needed, and after a loss
	lost        chan struct{} // closed when ps is lost
	channels    map[string]*subscription
	wakes       storekit.Wakes // the watches, by channel; woken under mu
	retryAt     time.Time
	backoff     time.Duration
	unsupported bool // the server has no sharded pub/sub
	closed      bool
	receivers   sync.WaitGroup
}

// subscription is one channel's state on a subscriber's connection.
type subscription struct {
	refs  int // watches that have not stopped
	state subState
	armed chan struct{} // closed when the server confirms a subscription
}

type subState int

const (
	subscribing subState = iota
	subscribed
	unsubscribing
)

func cmdCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), cmdTimeout)
}

func (s *subscriber) watch(ctx context.Context, channel string) (<-chan struct{}, func(), bool) {
	s.mu.Lock()
	if s.closed || s.unsupported || time.Now().Before(s.retryAt) {
		s.mu.Unlock()
		return nil, func() {}, false
	}
	if s.ps == nil {
		s.ps, s.lost = s.node.SSubscribe(context.Background()), make(chan struct{})
		s.receivers.Add(1)
		go s.receive(s.ps)
	}
	lost := s.lost
	sub := s.channels[channel]
	if sub == nil {
		sub = &subscription{armed: make(chan struct{})}
		s.channels[channel] = sub
		s.sendLocked(channel, true)
	}
	sub.refs++
	w := s.wakes.Add(channel)
	armed := sub.armed
	s.mu.Unlock()

	stop := sync.OnceFunc(func() { s.stop(channel, sub, w) })
	select {
	case <-armed:
		return w.Changed(), stop, true
	case <-lost:
	case <-ctx.Done():
	}
	stop()
	return nil, func() {}, false
}

// stop ends watch w of channel, and unsubscribes the channel when it was
// the last.
func (s *subscriber) stop(channel string, sub *subscription, w *storekit.Watch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Stop()
	if s.channels[channel] != sub {
		return // the connection was lost since: nothing left to undo
	}
	sub.refs--
	if sub.refs == 0 && sub.state == subscribed {
		sub.state, sub.armed = unsubscribing, make(chan struct{})
		s.sendLocked(channel, false)
	}
}

// sendLocked subscribes to channel, or unsubscribes from it, on the
// current connection; a failed write counts as a lost connection.
func (s *subscriber) sendLocked(channel string, subscribe bool) {
	ctx, cancel := cmdCtx()
	defer cancel()
	var err error
	if subscribe {
		err = s.ps.SSubscribe(ctx, channel)
	} else {
		err = s.ps.SUnsubscribe(ctx, channel)
	}
	if err != nil {
		s.loseLocked(err)
	}
}

// receive reads ps until it is lost or closed, pinging it when it has
// been silent for idleCheck.
func (s *subscriber) receive(ps *redis.PubSub) {
	defer s.receivers.Done()
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), idleCheck)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged {
				ctx, cancel := cmdCtx()
				err = ps.Ping(ctx)
				cancel()
				if err == nil {
					pinged = true
					continue
				}
			}
			s.mu.Lock()
			if s.ps == ps {
				s.loseLocked(err)
			}
			s.mu.Unlock()
			return
		}
		pinged = false
		s.handle(ps, msg)
	}
}

// handle applies one message read from ps.
func (s *subscriber) handle(ps *redis.PubSub, msg any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ps != ps {
		return
	}
	switch m := msg.(type) {
	case *redis.Message:
		s.wakes.Wake(m.Channel)
	case *redis.Subscription:
		sub := s.channels[m.Channel]
		switch {
		case m.Kind == "ssubscribe" && sub != nil && sub.state == subscribing:
			s.backoff = 0
			sub.state = subscribed
			close(sub.armed)
			if sub.refs == 0 {
				sub.state, sub.armed = unsubscribing, make(chan struct{})
				s.sendLocked(m.Channel, false)
			}
		case m.Kind == "sunsubscribe" && sub != nil && sub.state == unsubscribing:
			if sub.refs == 0 {
				delete(s.channels, m.Channel)
				return
			}
			sub.state = subscribing
			s.sendLocked(m.Channel, true)
		case m.Kind == "sunsubscribe":
			// Ended by the server (the channel's slot moved to another
			// node): the key's watches could miss a change.
			s.loseLocked(errors.New("redisstore: subscription ended by the server"))
		}
	}
}

// loseLocked drops the current connection after err: every watch it
// served is woken, and Watch reports not ok until the backoff has passed
// (for good if the server has no sharded pub/sub). The caller holds s.mu.
func (s *subscriber) loseLocked(err error) {
	if s.ps == nil {
		return
	}
	var rerr redis.Error
	if errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "ERR unknown command") {
		s.unsupported = true
	}
	s.wakes.WakeAll()
	clear(s.channels)
	close(s.lost)
	_ = s.ps.Close()
	s.ps = nil
	s.backoff = min(max(2*s.backoff, minResubscribe), maxResubscribe)
	s.retryAt = time.Now().Add(s.backoff)
}

// close drops the connection for good and waits for its reader.
func (s *subscriber) close() {
	s.mu.Lock()
	s.closed = true
	s.loseLocked(errors.New("redisstore: closed"))
	s.mu.Unlock()
	s.receivers.Wait()
}
