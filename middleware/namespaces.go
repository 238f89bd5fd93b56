package middleware

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// topicHandlers notices, when Config.Namespace is not set, the handlers of
// one topic that this middleware serves under different namespaces (their
// names). That is right for different consumers of the topic (billing and
// email each handle an order once), and wrong for copies of one consumer
// competing for its messages (handlers orders-0 … orders-3 for
// concurrency): a duplicate that lands on another copy runs again. The
// middleware cannot tell the two apart, so it says so once per pair.
type topicHandlers struct {
	pairs sync.Map // topic + "\x00" + handler -> struct{}: the fast path

	mu   sync.Mutex
	seen map[string][]string // topic -> handlers, in order of first delivery
}

// note records that handler received a message of topic, and returns the
// handler that received one before under another namespace, the first
// time the pair is seen.
func (t *topicHandlers) note(topic, handler string) (other string, first bool) {
	if topic == "" || handler == "" {
		return "", false
	}
	if _, ok := t.pairs.Load(topic + "\x00" + handler); ok {
		return "", false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, loaded := t.pairs.LoadOrStore(topic+"\x00"+handler, struct{}{}); loaded {
		return "", false
	}
	if t.seen == nil {
		t.seen = map[string][]string{}
	}
	handlers := t.seen[topic]
	t.seen[topic] = append(handlers, handler)
	if len(handlers) == 0 {
		return "", false
	}
	return handlers[0], true
}

// warnSharedTopic logs, once per pair, a handler that shares its topic
// with another under the default namespace.
func (m *Idempotency) warnSharedTopic(msg *message.Message, handler string) {
	if m.cfg.Namespace != "" {
		return
	}
	topic := message.SubscribeTopicFromCtx(msg.Context())
	other, first := m.handlers.note(topic, handler)
	if !first {
		return
	}
	m.cfg.Logger.Info("idempotency: two handlers take messages of one topic, each under its own name as namespace: "+
		"right if they are different consumers (each handles every message once); wrong if they are copies of one "+
		"consumer sharing its messages, where a duplicate landing on the other copy runs again: give those one "+
		"Config.Namespace", watermill.LogFields{"topic": topic, "handler": handler, "other_handler": other})
}
