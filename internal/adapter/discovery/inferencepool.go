package discovery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/tlgate/tlgate/internal/adapter/config"
)

// InferencePoolResource is the resource an InferencePool source watches:
// the Gateway API Inference Extension's InferencePool, GA version.
var InferencePoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// InferencePool is a source that serves the pods of an InferencePool
// (inference.networking.k8s.io/v1): it watches the pool by name, and the
// Pods its spec.selector picks in its namespace, each pod an engine on each
// of the pool's spec.targetPorts. A change to the pool's selector starts a
// new pod watch with it (the fleet moves to the pods it now picks); a
// change to its target ports moves the engines; a pool that does not exist
// has no engines. Pods are read as a kubernetes source with a selector
// reads them: routable while Ready, draining when not Ready or once being
// deleted, the model and role from their labels. It needs list and watch
// on the InferencePool (by name) and on Pods in that namespace, nothing
// more.
type InferencePool struct {
	cfg       config.Discovery
	log       zerolog.Logger
	client    kubernetes.Interface
	dyn       dynamic.Interface
	namespace string
	pods      *Kubernetes // reads each pod as a selector source does
	missing   bool        // the pool was last seen absent or unusable (logged once)
}

// poolSpec is what a source reads of an InferencePool.
type poolSpec struct {
	selector labels.Set // spec.selector.matchLabels
	ports    []int      // spec.targetPorts[].number, in order, each once
}

// Errors of an InferencePool a source cannot serve.
var (
	ErrPoolSelector = errors.New("spec.selector.matchLabels is empty or absent")
	ErrPoolPorts    = errors.New("spec.targetPorts has no port number in 1..65535")
)

// NewInferencePool returns the source c configures, with a client from
// c.Kubeconfig, or the in-cluster config when it is empty.
func NewInferencePool(c config.Discovery, log zerolog.Logger) (*InferencePool, error) {
	rc, client, err := clientOf(c)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSource, err)
	}
	return newInferencePool(c, log, client, dyn), nil
}

func newInferencePool(c config.Discovery, log zerolog.Logger, client kubernetes.Interface, dyn dynamic.Interface) *InferencePool {
	log = log.With().Str("inferencepool", c.Namespaces[0]+"/"+c.Pool).Logger()
	return &InferencePool{cfg: c, log: log, client: client, dyn: dyn, namespace: c.Namespaces[0],
		pods: &Kubernetes{cfg: c, log: log, client: client, warned: map[string]bool{}}}
}

// podWatch is an informer on the pods one selector picks.
type podWatch struct {
	selector labels.Set
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
}

// stop ends the watch (nil: nothing to stop).
func (w *podWatch) stop() {
	if w == nil {
		return
	}
	w.cancel()
	w.factory.Shutdown()
}

// Run watches the pool and reports its pods once both watches have
// listed, then after every change to either, until ctx ends.
func (s *InferencePool) Run(ctx context.Context, report func([]Endpoint)) {
	changed, handler := notifier()
	byName := fields.OneTermEqualSelector("metadata.name", s.cfg.Pool).String()
	pf := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.dyn, 0, s.namespace,
		func(o *metav1.ListOptions) { o.FieldSelector = byName })
	pool := pf.ForResource(InferencePoolResource).Informer()
	watch(ctx, s.log, pool, handler, "discovery: InferencePool watch failed (is the InferencePool CRD, inference.networking.k8s.io/v1, installed, and may the gateway list and watch it?); retrying, keeping the last engines")
	pf.Start(ctx.Done())
	defer pf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), pool.HasSynced) {
		return
	}
	var pods *podWatch
	defer func() { pods.stop() }()
	for {
		spec, ok := s.spec(pool.GetStore())
		switch {
		case !ok:
			pods.stop()
			pods = nil
		case pods == nil || !maps.Equal(pods.selector, spec.selector):
			pods.stop()
			pods = s.watchPods(ctx, spec.selector, handler)
			if !cache.WaitForCacheSync(ctx.Done(), pods.informer.HasSynced) {
				return
			}
			s.log.Info().Str("selector", spec.selector.String()).Ints("target_ports", spec.ports).Msg("discovery: watching the InferencePool's pods")
		}
		var eps []Endpoint
		if pods != nil {
			eps = s.endpoints(spec, pods.informer.GetStore().List())
		}
		report(eps)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// spec reads the pool from the informer's store; false when it does not
// exist or cannot be served (logged once until it can).
func (s *InferencePool) spec(store cache.Store) (poolSpec, bool) {
	obj, exists, err := store.GetByKey(s.namespace + "/" + s.cfg.Pool)
	var spec poolSpec
	if err == nil && !exists {
		err = errors.New("not found: no engines until it exists")
	}
	if err == nil {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			err = fmt.Errorf("unexpected object %T", obj)
		} else {
			spec, err = parsePool(u)
		}
	}
	if err != nil {
		if !s.missing {
			s.log.Warn().Err(err).Msg("discovery: InferencePool not served")
		}
		s.missing = true
		return poolSpec{}, false
	}
	if s.missing {
		s.log.Info().Msg("discovery: InferencePool found")
	}
	s.missing = false
	return spec, true
}

// parsePool reads an InferencePool's selector and target ports.
func parsePool(u *unstructured.Unstructured) (poolSpec, error) {
	sel, _, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return poolSpec{}, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	if len(sel) == 0 {
		return poolSpec{}, ErrPoolSelector
	}
	ports, _, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil {
		return poolSpec{}, fmt.Errorf("spec.targetPorts: %w", err)
	}
	spec := poolSpec{selector: labels.Set(sel)}
	for _, p := range ports {
		m, ok := p.(map[string]any)
		if !ok {
			continue
		}
		n, ok, _ := unstructured.NestedInt64(m, "number")
		if ok && n >= 1 && n <= 65535 && !slices.Contains(spec.ports, int(n)) {
			spec.ports = append(spec.ports, int(n))
		}
	}
	if len(spec.ports) == 0 {
		return poolSpec{}, ErrPoolPorts
	}
	return spec, nil
}

// watchPods starts an informer on the pool namespace's pods that selector
// picks.
func (s *InferencePool) watchPods(ctx context.Context, selector labels.Set, handler cache.ResourceEventHandler) *podWatch {
	wctx, cancel := context.WithCancel(ctx)
	sel := selector.String()
	f := informers.NewSharedInformerFactoryWithOptions(s.client, 0, informers.WithNamespace(s.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	inf := f.Core().V1().Pods().Informer()
	watch(wctx, s.log, inf, handler, "discovery: Kubernetes watch of the InferencePool's pods failed; retrying, keeping the last engines")
	f.Start(wctx.Done())
	return &podWatch{selector: selector, factory: f, informer: inf, cancel: cancel}
}

// endpoints maps the pods the pool's selector picks to engines: one per
// pod and target port, keyed "<namespace>:<pod>:<port>".
func (s *InferencePool) endpoints(spec poolSpec, objs []any) []Endpoint {
	sel := labels.SelectorFromSet(spec.selector)
	out := []Endpoint{}
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Namespace != s.namespace || !sel.Matches(labels.Set(p.Labels)) {
			continue
		}
		for _, port := range spec.ports {
			ep, ok := s.pods.podEndpointAt(p, port)
			if !ok {
				break
			}
			ep.Key += ":" + strconv.Itoa(port)
			out = append(out, ep)
		}
	}
	slices.SortFunc(out, func(a, b Endpoint) int { return strings.Compare(a.Key, b.Key) })
	return out
}
