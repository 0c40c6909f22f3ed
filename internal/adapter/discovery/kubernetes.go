package discovery

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tlgate/tlgate/internal/adapter/config"
	"github.com/tlgate/tlgate/internal/routing/fleet"
)

// Kubernetes is a source that watches the Kubernetes API with informers
// (a list, then a watch, re-listed after any break such as an API server
// restart): the EndpointSlices of a Service, or the Pods matching a label
// selector, in each of its namespaces. It needs list and watch on those
// resources in those namespaces, nothing more (deploy/kubernetes/rbac.yaml).
//
// An EndpointSlice endpoint is routable while its ready condition is true
// (an absent condition counts as ready, as the API defines it) and drains
// otherwise, terminating ones included; a pod is routable while its Ready
// condition is true and drains when not Ready or once it is being deleted.
// An endpoint or pod that is gone is no longer reported.
type Kubernetes struct {
	cfg      config.Discovery
	log      zerolog.Logger
	client   kubernetes.Interface
	selector string // the informers' label selector

	mu     sync.Mutex
	warned map[string]bool // pods whose labels were logged as unusable, and portUnmatched
}

// portUnmatched is the key of warned that says a port name that matched no
// port was logged (no pod key has a space).
const portUnmatched = "port unmatched"

// serviceNameLabel is the label an EndpointSlice names its Service with.
const serviceNameLabel = "kubernetes.io/service-name"

// NewKubernetes returns the source c configures, with a client from
// c.Kubeconfig, or the in-cluster config when it is empty.
func NewKubernetes(c config.Discovery, log zerolog.Logger) (*Kubernetes, error) {
	_, client, err := clientOf(c)
	if err != nil {
		return nil, err
	}
	return newKubernetes(c, log, client)
}

// clientOf returns the API server client configuration of source c (from
// c.Kubeconfig, or the in-cluster config when it is empty) and a client
// made with it.
func clientOf(c config.Discovery) (*rest.Config, kubernetes.Interface, error) {
	rc, err := restConfig(c)
	if err != nil {
		return nil, nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrSource, err)
	}
	return rc, client, nil
}

func restConfig(c config.Discovery) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if c.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("%w: kubeconfig %s: %w", ErrSource, c.Kubeconfig, err)
		}
	} else {
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("%w: in-cluster config (set kubeconfig to run outside a cluster): %w", ErrSource, err)
		}
	}
	rc.UserAgent = "tlgate-discovery"
	return rc, nil
}

func newKubernetes(c config.Discovery, log zerolog.Logger, client kubernetes.Interface) (*Kubernetes, error) {
	k := &Kubernetes{cfg: c, log: log, client: client, warned: map[string]bool{}}
	if c.Service != "" {
		k.selector = serviceNameLabel + "=" + c.Service
	} else {
		sel, err := labels.Parse(c.Selector)
		if err != nil {
			return nil, fmt.Errorf("%w: selector %q: %w", ErrSource, c.Selector, err)
		}
		k.selector = sel.String()
	}
	return k, nil
}

// Run starts an informer per namespace and reports the set once every
// informer has listed, then after every change, until ctx ends.
func (k *Kubernetes) Run(ctx context.Context, report func([]Endpoint)) {
	changed, handler := notifier()
	var factories []informers.SharedInformerFactory
	var stores []cache.Store
	var synced []cache.InformerSynced
	for _, ns := range k.cfg.Namespaces {
		f := informers.NewSharedInformerFactoryWithOptions(k.client, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = k.selector }))
		var inf cache.SharedIndexInformer
		if k.cfg.Service != "" {
			inf = f.Discovery().V1().EndpointSlices().Informer()
		} else {
			inf = f.Core().V1().Pods().Informer()
		}
		watch(ctx, k.log.With().Str("namespace", ns).Logger(), inf, handler, "discovery: Kubernetes watch failed; retrying, keeping the last engines")
		factories = append(factories, f)
		stores = append(stores, inf.GetStore())
		synced = append(synced, inf.HasSynced)
	}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	defer func() {
		for _, f := range factories {
			f.Shutdown()
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	k.log.Info().Strs("namespaces", k.cfg.Namespaces).Str("selector", k.selector).Msg("discovery: Kubernetes informers synced")
	for {
		var objs []any
		for _, s := range stores {
			objs = append(objs, s.List()...)
		}
		report(k.endpoints(objs))
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// notifier returns a channel that holds one value after any change an
// informer given handler sees (changes in a burst coalesce).
func notifier() (<-chan struct{}, cache.ResourceEventHandlerFuncs) {
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	return changed, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
}

// watch gives inf handler, and logs its watch's failures (while ctx lasts)
// with msg.
func watch(ctx context.Context, log zerolog.Logger, inf cache.SharedIndexInformer, handler cache.ResourceEventHandler, msg string) {
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() == nil {
			log.Warn().Err(err).Msg(msg)
		}
	})
	if _, err := inf.AddEventHandler(handler); err != nil {
		log.Error().Err(err).Msg("discovery: informer refused its handler")
	}
}

// endpoints maps the informers' objects to the set to report. The
// informers list in no set order, and one engine may be listed more than
// once: in two slices while the controller moves it, and in one slice per
// address family on a dual-stack Service (a pod's IPv4 and IPv6 addresses,
// both under its key). Each key gets the same endpoint whatever the order:
// the address of the first family by addressFamily (IPv4, then IPv6,
// then names), the smallest of them, routable if any listing of the key
// says so; so a pod's worker neither flips between its addresses (each
// flip would restart its probes) nor drains while one listing is late.
func (k *Kubernetes) endpoints(objs []any) []Endpoint {
	byKey := map[string]Endpoint{}
	routable := map[string]bool{}
	add := func(ep Endpoint) {
		routable[ep.Key] = routable[ep.Key] || !ep.Draining
		if old, ok := byKey[ep.Key]; ok && !preferAddress(ep.Address, old.Address) {
			return
		}
		byKey[ep.Key] = ep
	}
	for _, o := range objs {
		switch x := o.(type) {
		case *discoveryv1.EndpointSlice:
			for _, ep := range k.sliceEndpoints(x) {
				add(ep)
			}
		case *corev1.Pod:
			if ep, ok := k.podEndpoint(x); ok {
				add(ep)
			}
		}
	}
	out := make([]Endpoint, 0, len(byKey))
	for key, ep := range byKey {
		ep.Draining = !routable[key]
		out = append(out, ep)
	}
	slices.SortFunc(out, func(a, b Endpoint) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// addressFamily ranks the address families an engine's address is
// taken from when it has several: IPv4 first (reachable from single-stack
// gateways too), then IPv6, then host names (FQDN slices).
func addressFamily(hostport string) int {
	host, _, _ := net.SplitHostPort(hostport)
	switch ip, err := netip.ParseAddr(host); {
	case err != nil:
		return 2
	case ip.Is4() || ip.Is4In6():
		return 0
	}
	return 1
}

// preferAddress reports whether address a is to be kept over b for one
// engine: a lower-ranked family, else the smaller address.
func preferAddress(a, b string) bool {
	if fa, fb := addressFamily(a), addressFamily(b); fa != fb {
		return fa < fb
	}
	return a < b
}

// slicePort is the slice's port that the source's port names, or 0.
func (k *Kubernetes) slicePort(s *discoveryv1.EndpointSlice) int {
	if n := k.cfg.Port.Number(); n > 0 {
		return n
	}
	for _, p := range s.Ports {
		if p.Name != nil && *p.Name == string(k.cfg.Port) && p.Port != nil {
			return int(*p.Port)
		}
	}
	return 0
}

func (k *Kubernetes) sliceEndpoints(s *discoveryv1.EndpointSlice) []Endpoint {
	port := k.slicePort(s)
	if port == 0 {
		if len(s.Endpoints) > 0 {
			var ports []string
			for _, p := range s.Ports {
				if p.Port != nil {
					ports = append(ports, portName(p.Name)+":"+strconv.Itoa(int(*p.Port)))
				}
			}
			k.warnUnmatchedPort("EndpointSlice", s.Namespace+"/"+s.Name, ports)
		}
		return nil
	}
	var out []Endpoint
	for _, e := range s.Endpoints {
		if len(e.Addresses) == 0 {
			continue
		}
		addr := e.Addresses[0]
		key := s.Namespace + ":" + addr + "-" + strconv.Itoa(port)
		if e.TargetRef != nil && e.TargetRef.Kind == "Pod" && e.TargetRef.Name != "" {
			key = s.Namespace + ":" + e.TargetRef.Name
		}
		ready := e.Conditions.Ready == nil || *e.Conditions.Ready
		terminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
		out = append(out, Endpoint{Key: key, Address: hostPort(addr, port), Draining: !ready || terminating})
	}
	return out
}

func (k *Kubernetes) podEndpoint(p *corev1.Pod) (Endpoint, bool) {
	port := k.cfg.Port.Number()
	if port == 0 {
		var ports []string
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == string(k.cfg.Port) {
					port = int(cp.ContainerPort)
				}
				ports = append(ports, portName(&cp.Name)+":"+strconv.Itoa(int(cp.ContainerPort)))
			}
		}
		if port == 0 && p.Status.PodIP != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			k.warnUnmatchedPort("pod", p.Namespace+"/"+p.Name, ports)
		}
	}
	return k.podEndpointAt(p, port)
}

// warnUnmatchedPort logs, once for the source, that the configured port
// name matched none of the ports (name:number) of an EndpointSlice or pod
// (what, named name), whose endpoints are therefore no engines.
func (k *Kubernetes) warnUnmatchedPort(what, name string, ports []string) {
	k.warnOnce(portUnmatched, func() {
		k.log.Warn().Str("port", string(k.cfg.Port)).Str(strings.ToLower(what), name).Strs("ports", ports).
			Msg("discovery: the configured port name matches no port of a " + what + "; its endpoints are left out (logged once)")
	})
}

// portName is a port's name for a log line.
func portName(n *string) string {
	if n == nil || *n == "" {
		return "(unnamed)"
	}
	return *n
}

// podEndpointAt is pod p as an engine on port (none when 0): keyed by its
// namespace and name, with the model and role its labels give, draining
// unless Ready or once being deleted; a pod with no IP yet or that has
// ended is none.
func (k *Kubernetes) podEndpointAt(p *corev1.Pod, port int) (Endpoint, bool) {
	if port == 0 || p.Status.PodIP == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return Endpoint{}, false
	}
	key := p.Namespace + ":" + p.Name
	ep := Endpoint{Key: key, Address: hostPort(p.Status.PodIP, port)}
	switch {
	case k.cfg.ModelLabel != "":
		ep.Model = p.Labels[k.cfg.ModelLabel]
	case k.cfg.ModelAnnotation != "":
		ep.Model = p.Annotations[k.cfg.ModelAnnotation]
	}
	if k.cfg.RoleLabel != "" {
		switch role := p.Labels[k.cfg.RoleLabel]; role {
		case "", config.RoleUnified, config.RolePrefill, config.RoleDecode:
			ep.Role = role
		default:
			k.warnOnce(key, func() {
				k.log.Error().Str("pod", key).Str("label", k.cfg.RoleLabel).Str("role", role).
					Msg("discovery: pod skipped: its role label is not unified, prefill or decode")
			})
			return Endpoint{}, false
		}
	}
	if !k.bootstrapPort(p, key, &ep) {
		return Endpoint{}, false
	}
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	ep.Draining = !ready || p.DeletionTimestamp != nil
	return ep, true
}

// bootstrapPort reads pod p's bootstrap port from the configured label or
// annotation into ep; it reports false (and logs once) when the pod holds
// one that is not a port number, and the pod is skipped.
func (k *Kubernetes) bootstrapPort(p *corev1.Pod, key string, ep *Endpoint) bool {
	name, val := k.cfg.BootstrapPortLabel, ""
	switch {
	case name != "":
		val = p.Labels[name]
	case k.cfg.BootstrapPortAnnotation != "":
		name = k.cfg.BootstrapPortAnnotation
		val = p.Annotations[name]
	}
	if val == "" {
		return true
	}
	port, ok := fleet.ParseBootstrapPort(val)
	if !ok {
		k.warnOnce(key, func() {
			k.log.Error().Str("pod", key).Str("key", name).Str("bootstrap_port", val).
				Msg("discovery: pod skipped: its bootstrap port is not a port number")
		})
		return false
	}
	ep.BootstrapPort = port
	return true
}

func (k *Kubernetes) warnOnce(key string, log func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.warned[key] {
		k.warned[key] = true
		log()
	}
}
