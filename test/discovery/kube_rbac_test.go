package discovery_test

import (
	"bytes"
	"os"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// gatewayNS is the namespace the gateway's ServiceAccount lives in.
const gatewayNS = "tlgate"

// shippedRBAC reads deploy/kubernetes/rbac.yaml: its ServiceAccount, Role
// and RoleBinding.
func shippedRBAC(t *testing.T) (*corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var sa *corev1.ServiceAccount
	var role *rbacv1.Role
	var rb *rbacv1.RoleBinding
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("rbac.yaml: %v", err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			sa = o
		case *rbacv1.Role:
			role = o
		case *rbacv1.RoleBinding:
			rb = o
		default:
			t.Fatalf("rbac.yaml: unexpected %T", obj)
		}
	}
	if sa == nil || role == nil || rb == nil {
		t.Fatal("rbac.yaml: want a ServiceAccount, a Role and a RoleBinding")
	}
	return sa, role, rb
}

// applyRBAC creates the namespaces, the shipped ServiceAccount in
// gatewayNS and the shipped Role and RoleBinding in each of watched (as
// kustomize, or an operator for another namespace, would), and returns a
// token of the ServiceAccount from the TokenRequest API.
func applyRBAC(t *testing.T, k *kube, watched ...string) string {
	t.Helper()
	sa, role, rb := shippedRBAC(t)
	for _, ns := range append([]string{gatewayNS}, watched...) {
		if _, err := k.Admin.CoreV1().Namespaces().Create(k.ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sa.Namespace = gatewayNS
	if _, err := k.Admin.CoreV1().ServiceAccounts(gatewayNS).Create(k.ctx(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range watched {
		r, b := role.DeepCopy(), rb.DeepCopy()
		r.Namespace, b.Namespace = ns, ns
		for i := range b.Subjects {
			b.Subjects[i].Namespace = gatewayNS
		}
		if _, err := k.Admin.RbacV1().Roles(ns).Create(k.ctx(), r, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := k.Admin.RbacV1().RoleBindings(ns).Create(k.ctx(), b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range watched {
		k.AwaitAllowed(t, gatewayNS, sa.Name, authorizationv1.ResourceAttributes{Namespace: ns, Resource: "pods", Verb: "list"})
	}
	exp := int64(3600)
	tr, err := k.Admin.CoreV1().ServiceAccounts(gatewayNS).CreateToken(k.ctx(), sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// checkLeastPrivilege checks that the ServiceAccount's token can list and
// watch EndpointSlices and Pods in watched and do nothing else: no get,
// create, update or delete there, nothing in another namespace or
// cluster-wide, no other resource.
func checkLeastPrivilege(t *testing.T, k *kube, token, watched, other string) {
	t.Helper()
	c, err := kubernetes.NewForConfig(k.rest(token))
	if err != nil {
		t.Fatal(err)
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("the gateway's ServiceAccount cannot %s: %v", what, err)
		}
	}
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("the gateway's ServiceAccount may %s (err %v), want forbidden", what, err)
		}
	}
	_, err = c.DiscoveryV1().EndpointSlices(watched).List(k.ctx(), metav1.ListOptions{})
	allowed("list EndpointSlices in "+watched, err)
	_, err = c.CoreV1().Pods(watched).List(k.ctx(), metav1.ListOptions{})
	allowed("list Pods in "+watched, err)
	for _, w := range []func() error{
		func() error {
			wi, err := c.DiscoveryV1().EndpointSlices(watched).Watch(k.ctx(), metav1.ListOptions{})
			if err == nil {
				wi.Stop()
			}
			return err
		},
		func() error {
			wi, err := c.CoreV1().Pods(watched).Watch(k.ctx(), metav1.ListOptions{})
			if err == nil {
				wi.Stop()
			}
			return err
		},
	} {
		allowed("watch EndpointSlices and Pods in "+watched, w())
	}

	_, err = c.DiscoveryV1().EndpointSlices(watched).Get(k.ctx(), "any", metav1.GetOptions{})
	forbidden("get an EndpointSlice", err)
	_, err = c.DiscoveryV1().EndpointSlices(watched).Create(k.ctx(), &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "intruder"}, AddressType: discoveryv1.AddressTypeIPv4}, metav1.CreateOptions{})
	forbidden("create an EndpointSlice", err)
	err = c.DiscoveryV1().EndpointSlices(watched).DeleteCollection(k.ctx(), metav1.DeleteOptions{}, metav1.ListOptions{})
	forbidden("delete EndpointSlices", err)
	_, err = c.CoreV1().Pods(watched).Create(k.ctx(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "intruder"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
	forbidden("create a Pod", err)
	err = c.CoreV1().Pods(watched).Delete(k.ctx(), "any", metav1.DeleteOptions{})
	forbidden("delete a Pod", err)
	_, err = c.CoreV1().Secrets(watched).List(k.ctx(), metav1.ListOptions{})
	forbidden("list Secrets", err)
	_, err = c.CoreV1().ConfigMaps(watched).List(k.ctx(), metav1.ListOptions{})
	forbidden("list ConfigMaps", err)
	_, err = c.CoreV1().Services(watched).List(k.ctx(), metav1.ListOptions{})
	forbidden("list Services", err)
	_, err = c.DiscoveryV1().EndpointSlices(other).List(k.ctx(), metav1.ListOptions{})
	forbidden("list EndpointSlices in "+other, err)
	_, err = c.CoreV1().Pods(other).List(k.ctx(), metav1.ListOptions{})
	forbidden("list Pods in "+other, err)
	_, err = c.CoreV1().Pods("").List(k.ctx(), metav1.ListOptions{})
	forbidden("list Pods cluster-wide", err)
	_, err = c.RbacV1().Roles(watched).List(k.ctx(), metav1.ListOptions{})
	forbidden("list Roles", err)
}
