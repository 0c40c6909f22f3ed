package kubeapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// FieldManager is the server-side apply field manager of the tests.
const FieldManager = "tlgate-test"

// Decode splits a multi-document YAML stream (helm template's, kustomize
// build's, a CRD file) into objects, skipping empty documents.
func Decode(b []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("decode: %w", err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			continue
		}
		// Unstructured's own decoding keeps integers int64, as the API
		// machinery expects.
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, fmt.Errorf("decode: %w in %s", err, raw)
		}
		out = append(out, u)
	}
}

// ObjectID names an object in messages: Kind namespace/name.
func ObjectID(u *unstructured.Unstructured) string {
	if ns := u.GetNamespace(); ns != "" {
		return u.GetKind() + " " + ns + "/" + u.GetName()
	}
	return u.GetKind() + " " + u.GetName()
}

// Applier applies objects to the apiserver by server-side apply, as one
// user.
type Applier struct {
	s      *Server
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// Applier returns an applier presenting token.
func (s *Server) Applier(token string) *Applier {
	s.t.Helper()
	rc := s.Rest(token)
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		s.t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		s.t.Fatal(err)
	}
	return &Applier{s: s, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

// Dynamic is the applier's dynamic client.
func (a *Applier) Dynamic() dynamic.Interface { return a.dyn }

// Apply applies u by server-side apply with strict field validation (an
// unknown or duplicated field is an error); with dryRun the apiserver
// validates and admits it (schemas, defaults, CEL rules, admission) and
// stores nothing. A namespaced object without a namespace goes to ns.
func (a *Applier) Apply(u *unstructured.Unstructured, ns string, dryRun bool) error {
	gvk := u.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s: %w", ObjectID(u), err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if u.GetNamespace() == "" {
			u = u.DeepCopy()
			u.SetNamespace(ns)
		}
		ri = a.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	body, err := u.MarshalJSON()
	if err != nil {
		return fmt.Errorf("%s: %w", ObjectID(u), err)
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: &force, FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := ri.Patch(a.s.Ctx(), u.GetName(), types.ApplyPatchType, body, opts); err != nil {
		return fmt.Errorf("%s: %w", ObjectID(u), err)
	}
	return nil
}

// InstallCRDs applies the CustomResourceDefinitions in files (YAML, paths)
// for real and waits until each is established and served.
func (a *Applier) InstallCRDs(files ...string) {
	a.s.t.Helper()
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			a.s.t.Fatal(err)
		}
		objs, err := Decode(b)
		if err != nil {
			a.s.t.Fatalf("%s: %v", f, err)
		}
		for _, u := range objs {
			if u.GetKind() != "CustomResourceDefinition" {
				a.s.t.Fatalf("%s: %s is not a CustomResourceDefinition", f, ObjectID(u))
			}
			if err := a.Apply(u, "", false); err != nil {
				a.s.t.Fatalf("%s: %v", f, err)
			}
			names = append(names, u.GetName())
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, name := range names {
		for {
			u, err := a.dyn.Resource(crds).Get(a.s.Ctx(), name, metav1.GetOptions{})
			if err == nil && established(u) {
				break
			}
			if time.Now().After(deadline) {
				a.s.t.Fatalf("CRD %s not established after 30s (err %v)", name, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	a.mapper.Reset()
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// CreateNamespaces creates each namespace that does not exist yet.
func (s *Server) CreateNamespaces(names ...string) {
	s.t.Helper()
	for _, ns := range names {
		_, err := s.Admin.CoreV1().Namespaces().Create(s.Ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			s.t.Fatal(err)
		}
	}
}

// Token returns a token of ServiceAccount ns/name (which must exist) from
// the TokenRequest API, valid for an hour.
func (s *Server) Token(ns, name string) string {
	s.t.Helper()
	exp := int64(3600)
	tr, err := s.Admin.CoreV1().ServiceAccounts(ns).CreateToken(s.Ctx(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatalf("token of ServiceAccount %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// Kinds lists the kinds of objs, "Kind namespace/name" each, for messages.
func Kinds(objs []*unstructured.Unstructured) string {
	ids := make([]string, len(objs))
	for i, u := range objs {
		ids[i] = ObjectID(u)
	}
	return strings.Join(ids, ", ")
}
