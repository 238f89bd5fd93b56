package outbox

import (
	"context"
	"reflect"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// How the Forwarder learns of new rows. watermill-sql's subscriber sleeps
// between its reads for as long as its BackoffManager says, on a timer
// nothing else can cut short; but it asks the manager after every read,
// and waits for its answer. A waker is a BackoffManager whose answer, when
// the read found nothing, comes when a wake arrives (a commit of this
// process, or a Postgres notification) or when the poll interval has
// passed, whichever is first; it then answers 0, and the subscriber reads
// at once. Everything else (the reads, the offsets, the acks, the resends)
// stays watermill-sql's.
//
// After a read that found rows, or after a wake, the next empty reads are
// retried after 1 ms, 2 ms, 4 ms ... 64 ms (127 ms in all), then every
// poll interval: on Postgres a row committed is read only once every
// transaction older than its own has ended (watermill-sql reads below the
// snapshot's xmin), and such a transaction, short as a rule, may end
// without a wake.

// firstRetry and lastRetry are the first and the last of the quick
// retries after activity.
const (
	firstRetry = time.Millisecond
	lastRetry  = 64 * time.Millisecond
)

// waker is the BackoffManager of one Forwarder's subscription.
type waker struct {
	wake  chan struct{} // one pending wake at most
	done  chan struct{} // closed when the subscription ends
	stop  sync.Once
	poll  time.Duration
	errs  wsql.BackoffManager // watermill-sql's answer to errors
	retry time.Duration       // the next quick retry; 0 when idle
}

func newWaker(poll time.Duration) *waker {
	return &waker{
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
		poll: poll,
		errs: wsql.NewDefaultBackoffManager(poll, 0),
	}
}

// Wake makes the subscription read at once, or right after its current
// read. It never blocks.
func (w *waker) Wake() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *waker) close() { w.stop.Do(func() { close(w.done) }) }

// HandleError implements wsql.BackoffManager. The subscriber calls it from
// its one goroutine, after each read.
func (w *waker) HandleError(logger watermill.LoggerAdapter, noMsg bool, err error) time.Duration {
	select {
	case <-w.done:
		return 0 // the subscriber sees its context or its closing next
	default:
	}
	if err != nil {
		w.retry = firstRetry
		return w.errs.HandleError(logger, noMsg, err)
	}
	if !noMsg {
		w.retry = firstRetry
		return 0
	}
	wait := w.poll
	if w.retry > 0 && w.retry <= lastRetry && w.retry < w.poll {
		wait = w.retry
		w.retry *= 2
	} else {
		w.retry = 0
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-w.wake:
		w.retry = firstRetry
	case <-t.C:
	case <-w.done:
	}
	return 0
}

// wakeKey names an outbox: its topic, and the pool it is on when that is
// a pointer (a *pgxpool.Pool, a *sql.DB).
type wakeKey struct {
	conn  uintptr
	topic string
}

func newWakeKey(conn any, topic string) wakeKey {
	k := wakeKey{topic: topic}
	if v := reflect.ValueOf(conn); v.Kind() == reflect.Pointer {
		k.conn = v.Pointer()
	}
	return k
}

// wakers holds, per outbox, the subscriptions of this process's
// Forwarders: a commit that wrote to the outbox wakes them all.
var wakers = struct {
	sync.Mutex
	m map[wakeKey]map[*waker]struct{}
}{m: map[wakeKey]map[*waker]struct{}{}}

func register(topic wakeKey, w *waker) (unregister func()) {
	wakers.Lock()
	defer wakers.Unlock()
	set := wakers.m[topic]
	if set == nil {
		set = map[*waker]struct{}{}
		wakers.m[topic] = set
	}
	set[w] = struct{}{}
	return func() {
		wakers.Lock()
		defer wakers.Unlock()
		delete(wakers.m[topic], w)
		if len(wakers.m[topic]) == 0 {
			delete(wakers.m, topic)
		}
	}
}

// Wake wakes this process's Forwarders of the outbox: rows were committed.
func (o *Outbox) Wake() {
	wakers.Lock()
	for w := range wakers.m[o.key] {
		w.Wake()
	}
	wakers.Unlock()
}

// Forwarding tells whether a Forwarder of the outbox runs in this process:
// then a commit's wake reaches it, and no other process needs telling.
func (o *Outbox) Forwarding() bool {
	wakers.Lock()
	defer wakers.Unlock()
	return len(wakers.m[o.key]) > 0
}

// Listener keeps a Forwarder's subscription told of rows that other
// processes commit (a Postgres LISTEN connection): it runs until ctx ends,
// calling wake for each notification and once after each (re)connection.
type Listener func(ctx context.Context, wake func())

// wokenSubscriber is watermill-sql's subscriber with a waker as its
// BackoffManager, registered for the outbox's commits while it reads.
type wokenSubscriber struct {
	*wsql.Subscriber
	key    wakeKey
	w      *waker
	listen Listener
	prune  func(ctx context.Context) // the pruning loop, if Retention is set
	stop   context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
}

// Subscribe starts the one subscription a Forwarder makes.
func (s *wokenSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	msgs, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	unregister := register(s.key, s.w)
	lctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.stop = cancel
	s.mu.Unlock()
	// When the subscription's context ends, the subscriber must not wait
	// for the poll interval to notice.
	context.AfterFunc(ctx, s.w.close)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer unregister()
		if s.listen != nil {
			s.listen(lctx, s.w.Wake)
		}
		<-lctx.Done()
	}()
	if s.prune != nil {
		s.wg.Go(func() { s.prune(lctx) })
	}
	return msgs, nil
}

// Close ends the subscription: the waker first, so that the subscriber
// does not sit out its wait.
func (s *wokenSubscriber) Close() error {
	s.w.close()
	s.mu.Lock()
	if s.stop != nil {
		s.stop()
	}
	s.mu.Unlock()
	err := s.Subscriber.Close()
	s.wg.Wait()
	return err
}
