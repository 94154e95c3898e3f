package agents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"hearth/agents/gateway"
	"hearth/agents/store"
	"hearth/agents/stream"
)

// Delegation: a running execution hands a task to another agent
// (TaskRequest.Parent). The child runs in a machine and session of its
// own, under limits carved out of what its parent has left; the parent's
// stream tells of each child's start and end ("child" events); a parent's
// end, however it ends, cancels the children still running before it is
// recorded.

// Default delegation limits (RunnerConfig.MaxDepth, MaxChildren).
const (
	DefaultMaxDepth    = 3
	DefaultMaxChildren = 8
)

// ErrRefused: a delegation the rules do not allow (depth, children,
// limits); the error says which rule and what the caller may ask.
var ErrRefused = errors.New("delegation refused")

// ChildPayload is the payload of a stream.Child event in a parent's
// stream: a child started (status pending) or ended (its final status,
// what it and its own children spent, and why it failed).
type ChildPayload struct {
	Execution string       `json:"execution"`
	Session   string       `json:"session"`
	Agent     string       `json:"agent"`
	Status    store.Status `json:"status"`
	USD       float64      `json:"usd"`
	Tokens    store.Tokens `json:"tokens"`
	Error     string       `json:"error,omitempty"`
}

// treeBudget is an execution's budget in a delegation tree: its own turn
// limit, and a USD limit shared by its own model calls and the children
// it delegates to. A child's USD limit is held out of it while the child
// runs, and replaced by what the child (with its descendants) spent when
// it ends; the execution's own calls see only what is left. So a tree
// never spends more than its root's limit: the gateway bounds each
// call by Remaining, the hard cap.
type treeBudget struct {
	own *gateway.Limits // the turn limit, and what the execution itself spent

	mu       sync.Mutex
	usd      float64 // the USD limit, for the execution and its children; 0: none
	held     float64 // the USD limits of the running children
	children float64 // what the ended children spent, with their descendants
}

func newTreeBudget(l Limits) *treeBudget {
	return &treeBudget{own: &gateway.Limits{Turns: l.Turns}, usd: l.USD}
}

var _ gateway.Budget = (*treeBudget)(nil)

// Check implements gateway.Budget: the turn limit as gateway.Limits has
// it, and the USD limit against own spend plus the children's.
func (b *treeBudget) Check() gateway.Decision {
	d := b.own.Check()
	if u, ok := b.Remaining(); ok {
		return gateway.Decide(append(d.Limits, u)...)
	}
	return d
}

// Remaining implements gateway.Budget: the USD limit less own spend and
// what the children hold or spent, so that the gateway bounds the
// execution's own calls by what its children leave it.
func (b *treeBudget) Remaining() (gateway.LimitUse, bool) {
	own, _ := b.own.Spent()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.usd <= 0 {
		return gateway.LimitUse{}, false
	}
	used := own + b.held + b.children
	u := gateway.LimitUse{Limit: "usd", Used: used, Max: b.usd}
	switch {
	case used >= b.usd:
		u.Level = gateway.Deny
	case used >= gateway.WarnAt*b.usd:
		u.Level = gateway.Warn
	}
	return u, true
}

// limit is the USD limit; 0: none.
func (b *treeBudget) limit() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.usd
}

// Raise adds usd to the USD limit (a top-up) and returns the new limit;
// a budget without a USD limit is left without one.
func (b *treeBudget) Raise(usd float64) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.usd > 0 && usd > 0 {
		b.usd += usd
	}
	return b.usd
}

// Charge implements gateway.Budget: a call the execution itself made.
func (b *treeBudget) Charge(usd float64, turns int) { b.own.Charge(usd, turns) }

// Spent is what the execution itself spent, and its turns.
func (b *treeBudget) Spent() (usd float64, turns int) { return b.own.Spent() }

// total is what the execution and its ended children spent.
func (b *treeBudget) total() float64 {
	own, _ := b.own.Spent()
	b.mu.Lock()
	defer b.mu.Unlock()
	return own + b.children
}

// left is what of the USD limit is neither spent nor held for a child.
func (b *treeBudget) left() float64 {
	own, _ := b.own.Spent()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.usd - own - b.held - b.children
}

// hold sets usd aside for a child, or says how much is left.
func (b *treeBudget) hold(usd float64) (left float64, ok bool) {
	own, _ := b.own.Spent()
	b.mu.Lock()
	defer b.mu.Unlock()
	left = b.usd - own - b.held - b.children
	if usd > left+1e-9 {
		return max(left, 0), false
	}
	b.held += usd
	return left, true
}

// settle replaces a child's held limit by what it spent.
func (b *treeBudget) settle(held, spent float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= held
	b.children += spent
}

// tree is a run's side of delegation: its children, and whether it still
// takes new ones.
type tree struct {
	mu        sync.Mutex
	changed   *sync.Cond // on mu: a child ended or an admission settled
	following bool       // the agent runs: it may delegate
	deadline  time.Time  // when its wall time runs out; zero: no limit
	ending    bool       // its end is being recorded: no new children
	kids      map[*run]struct{}
	admitting int // admitted, not yet running or refused

	parent     *run    // the run that delegated this one, or nil
	held       float64 // the USD this run holds of its parent's budget
	reattached bool    // taken up by Reattach: linked to its parent and children by track
	cancel     context.CancelFunc
	cancelNote string // why the parent cancelled it
}

func (t *tree) init() {
	t.changed = sync.NewCond(&t.mu)
	t.kids = map[*run]struct{}{}
}

// admission is a child admitted by its parent but not yet running.
type admission struct {
	parent *run
	depth  int
	limits Limits
	usd    float64 // held of the parent's budget
}

// admit applies the delegation rules to a child of agent def asking
// ask, with the limits the child's definition and the request give
// (limits). It returns the child's limits, tightened to what the parent
// has left, and holds a slot and the child's USD limit until adopt or
// abandon.
func (r *Runner) admit(parentID string, def *Definition, ask, limits Limits) (*admission, error) {
	r.mu.Lock()
	pr := r.runs[parentID]
	r.mu.Unlock()
	if pr == nil {
		return nil, fmt.Errorf("%w: parent execution %s is not running here: only a running execution delegates, and only its own tasks", ErrNotFound, parentID)
	}
	refuse := func(format string, args ...any) (*admission, error) {
		return nil, fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
	}
	t := &pr.tree
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case !t.following || pr.detached:
		return refuse("parent execution %s is not running its agent", parentID)
	case t.ending:
		return refuse("parent execution %s is ending", parentID)
	}
	depth := pr.exec.Depth + 1
	if depth > r.maxDepth() {
		return refuse("a child of %s would be at depth %d, and delegation goes %d deep at most (agents.max_depth): do this task yourself", parentID, depth, r.maxDepth())
	}
	if n := len(t.kids) + t.admitting; n >= r.maxChildren() {
		return refuse("%s already has %d children running, the most it may have at once (agents.max_children): wait for one to end", parentID, n)
	}
	if pr.limits.Turns > 0 {
		_, used := pr.budget.Spent()
		left := pr.limits.Turns - used
		switch {
		case left <= 0:
			return refuse("the parent has no turns left")
		case ask.Turns > left:
			return refuse("asked %d turns, the parent has %d left", ask.Turns, left)
		case limits.Turns == 0 || limits.Turns > left:
			limits.Turns = left
		}
	}
	if !t.deadline.IsZero() {
		left := time.Until(t.deadline).Truncate(time.Second)
		switch {
		case left <= 0:
			return refuse("the parent has no wall time left")
		case time.Duration(ask.WallTime) > left:
			return refuse("asked a wall time of %v, the parent has %v left", time.Duration(ask.WallTime), left)
		case limits.WallTime == 0 || time.Duration(limits.WallTime) > left:
			limits.WallTime = Duration(left)
		}
	}
	a := &admission{parent: pr, depth: depth, limits: limits}
	if pr.budget.usd > 0 {
		if limits.USD <= 0 {
			return refuse("agent %s has no usd limit and none was asked: give a usd limit of at most $%.2f (what the parent has left)", def.Name, max(pr.budget.left(), 0))
		}
		left, ok := pr.budget.hold(limits.USD)
		switch {
		case !ok && ask.USD > 0:
			return refuse("asked $%.2f, the parent has $%.2f left", limits.USD, left)
		case !ok:
			return refuse("agent %s's usd limit of $%.2f is more than the parent has left: give a usd limit of at most $%.2f", def.Name, limits.USD, left)
		}
		a.usd = limits.USD
	}
	t.admitting++
	return a, nil
}

// abandon gives back what admit held, for a child that did not start.
func (a *admission) abandon() {
	a.parent.budget.settle(a.usd, 0)
	t := &a.parent.tree
	t.mu.Lock()
	t.admitting--
	t.changed.Broadcast()
	t.mu.Unlock()
}

// adopt makes ru (recorded, not started) a running child of the parent,
// and tells the parent's stream. It fails when the parent began to end
// meanwhile: then ru must not start.
func (a *admission) adopt(ru *run) error {
	t := &a.parent.tree
	t.mu.Lock()
	t.admitting--
	if t.ending {
		t.changed.Broadcast()
		t.mu.Unlock()
		a.parent.budget.settle(a.usd, 0)
		return fmt.Errorf("%w: parent execution %s ended before its child could start", ErrRefused, a.parent.exec.ID)
	}
	t.kids[ru] = struct{}{}
	t.mu.Unlock()
	ru.setParent(a.parent, a.usd)
	a.parent.emit(stream.New("", "", stream.Child, ChildPayload{Execution: ru.exec.ID, Session: ru.exec.Session,
		Agent: ru.exec.Agent, Status: ru.exec.Status}))
	return nil
}

// setParent makes pr ru's parent, ru holding usd of pr's budget.
func (ru *run) setParent(pr *run, usd float64) {
	ru.tree.mu.Lock()
	ru.tree.parent, ru.tree.held = pr, usd
	ru.tree.mu.Unlock()
}

// parentRun is ru's parent, with what ru holds of its budget.
func (ru *run) parentRun() (*run, float64) {
	ru.tree.mu.Lock()
	defer ru.tree.mu.Unlock()
	return ru.tree.parent, ru.tree.held
}

// childEnded settles an ended child with its parent: the parent's
// budget counts what the child spent instead of what it held, the
// parent's stream is told, and the parent may end. A child the runner
// detached from goes on in its machine: it only leaves its parent's
// children here, still holding its limit.
func (ru *run) childEnded(e store.Execution) {
	pr, held := ru.parentRun()
	if pr == nil {
		return
	}
	if ru.detached {
		pr.tree.mu.Lock()
		delete(pr.tree.kids, ru)
		pr.tree.changed.Broadcast()
		pr.tree.mu.Unlock()
		return
	}
	spent := ru.budget.total()
	pr.budget.settle(held, spent)
	pr.emit(stream.New("", "", stream.Child, ChildPayload{Execution: ru.exec.ID, Session: ru.exec.Session,
		Agent: ru.exec.Agent, Status: e.Status, USD: spent, Tokens: e.TotalTokens, Error: e.Error}))
	t := &pr.tree
	t.mu.Lock()
	delete(t.kids, ru)
	t.changed.Broadcast()
	t.mu.Unlock()
}

// endChildren stops the run from taking children, cancels those still
// running and waits until each has ended (they end cancelled, their
// partial outputs kept). A run calls it before its own end is recorded.
func (ru *run) endChildren(why string) {
	t := &ru.tree
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ending = true
	if t.kids == nil {
		return
	}
	for k := range t.kids {
		k.cancelByParent(fmt.Sprintf("cancelled: its parent %s %s", ru.exec.ID, why))
	}
	for len(t.kids) > 0 || t.admitting > 0 {
		t.changed.Wait()
	}
}

// cancelByParent stops a child because its parent ends.
func (ru *run) cancelByParent(note string) {
	ru.tree.mu.Lock()
	if ru.tree.cancelNote == "" {
		ru.tree.cancelNote = note
	}
	cancel := ru.tree.cancel
	ru.tree.mu.Unlock()
	ru.stop(stopCancel)
	if cancel != nil {
		cancel()
	}
}

func (ru *run) parentCancelNote() string {
	ru.tree.mu.Lock()
	defer ru.tree.mu.Unlock()
	return ru.tree.cancelNote
}

// startFollowing marks the run's agent as running, from which it may
// delegate, with the wall time it has left.
func (ru *run) startFollowing(deadline time.Time) {
	ru.tree.mu.Lock()
	ru.tree.following, ru.tree.deadline = true, deadline
	ru.tree.mu.Unlock()
}

// reserveCredits sets the execution's USD limit aside in the credit
// ledger: from the balance for a root, from its parent's reservation for
// a child.
func (ru *run) reserveCredits(ctx context.Context) error {
	st := ru.r.cfg.Store
	if pr, held := ru.parentRun(); pr != nil && held > 0 {
		return st.Carve(ctx, pr.exec.ID, ru.exec.ID, held)
	}
	return st.Reserve(ctx, ru.exec.ID, ru.limits.USD)
}

// releaseCredits gives back the unspent rest of the reservation: to the
// parent's for a child, to the balance for a root.
// A release the ledger refuses leaves the credits reserved (none is
// lost); the execution's stream says so.
func (ru *run) releaseCredits(ctx context.Context) {
	st := ru.r.cfg.Store
	var err error
	if pr, held := ru.parentRun(); pr != nil && held > 0 {
		err = st.GiveBack(ctx, ru.exec.ID, pr.exec.ID)
	} else {
		err = st.Release(ctx, ru.exec.ID)
	}
	if err != nil {
		ru.emit(stream.New("", "", stream.Error, map[string]string{"message": "could not release the rest of the execution's credit reservation (it stays reserved): " + err.Error()}))
	}
}

func (r *Runner) maxDepth() int {
	if r.cfg.MaxDepth > 0 {
		return r.cfg.MaxDepth
	}
	return DefaultMaxDepth
}

func (r *Runner) maxChildren() int {
	if r.cfg.MaxChildren > 0 {
		return r.cfg.MaxChildren
	}
	return DefaultMaxChildren
}

// seedTree gives a run taken up again (Reattach) what its children spent
// or hold: an ended child's total counts as spent, a running one's USD
// limit as held until it is taken up too and linked (see link).
func (ru *run) seedTree(ctx context.Context) error {
	ru.tree.reattached = true
	kids, err := ru.r.cfg.Store.Children(ctx, ru.exec.ID)
	if err != nil {
		return err
	}
	for _, k := range kids {
		if k.Status.Terminal() {
			ru.budget.settle(0, k.TotalUSD)
		} else {
			ru.budget.settle(-k.Limits.USD, 0)
		}
	}
	return nil
}

// link joins a run taken up again to its parent and children taken up
// before it, as admission and adopt did for the runner that started
// them: the parent's end cancels the child, the child's end settles with
// the parent. The caller holds r.mu.
func (r *Runner) link(ru *run) {
	if !ru.tree.reattached {
		return
	}
	join := func(pr, k *run) {
		pr.tree.mu.Lock()
		if pr.tree.ending {
			pr.tree.mu.Unlock()
			return
		}
		pr.tree.kids[k] = struct{}{}
		pr.tree.mu.Unlock()
		k.setParent(pr, k.exec.Limits.USD)
	}
	if pr := r.runs[ru.exec.Parent]; ru.exec.Parent != "" && pr != nil && pr.tree.reattached {
		join(pr, ru)
	}
	for _, k := range r.runs {
		if p, _ := k.parentRun(); k.tree.reattached && k.exec.Parent == ru.exec.ID && p == nil {
			join(ru, k)
		}
	}
}
