package kubernetes_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/kubernetes"
)

// The Role README documents is enough: a service account holding only it
// (the test impersonates it) makes a sandbox, runs a command, snapshots
// and restores it, closes both and prunes; without pods/exec, New fails
// naming what to grant.
func TestRBAC(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	ns := drv.Namespace()
	const name = "agentsandbox-rbac-test"
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "watch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/exec", "pods/attach"}, Verbs: []string{"create", "get"}},
		},
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
	}
	for _, f := range []func() error{
		func() error { _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); return err },
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{})
			return err
		},
	} {
		if err := f(); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		cs.RbacV1().RoleBindings(ns).Delete(ctx, name, metav1.DeleteOptions{})
		cs.CoreV1().ServiceAccounts(ns).Delete(ctx, name, metav1.DeleteOptions{})
		cs.RbacV1().Roles(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
	admin, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	as := rest.CopyConfig(admin)
	as.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + name}
	limited := kubernetes.New(kubernetes.Config{REST: as, Namespace: ns})
	defer limited.Close()

	sb, err := sandbox.New(ctx, sandbox.WithDriver(limited), sandbox.WithImage(busyboxImage))
	if err != nil {
		t.Fatalf("New with the documented Role: %v", err)
	}
	if r, err := sb.Exec(ctx, "echo ok > f; cat f"); err != nil || r.Stdout != "ok\n" {
		t.Errorf("Exec: %+v, %v", r, err)
	}
	// List and Open need nothing more: a tethered sandbox is listed, and
	// refused as not leased (not forbidden).
	if infos, err := limited.List(ctx, nil); err != nil || !containsID(infos, sb.ID()) {
		t.Errorf("List with the documented Role: %d sandboxes, %v; want %s among them", len(infos), err, sb.ID())
	}
	if _, _, err := limited.Open(ctx, sb.ID(), driver.OpenOptions{}); !errors.Is(err, driver.ErrNotLeased) {
		t.Errorf("Open of a tethered sandbox with the documented Role: %v; want ErrNotLeased", err)
	}
	snap, err := sb.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Remove(ctx)
	fork, err := snap.New(ctx, sandbox.WithDriver(limited))
	if err != nil {
		t.Fatalf("restore with the documented Role: %v", err)
	}
	if b, err := fork.ReadFile(ctx, "f"); err != nil || string(b) != "ok\n" {
		t.Errorf("the restored file: %q, %v", b, err)
	}
	fork.Close()
	if err := sb.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := limited.Prune(ctx); err != nil {
		t.Errorf("Prune with the documented Role: %v", err)
	}

	// Without pods/exec: a clear error naming what to grant, no pod left.
	role.Rules[1].Resources = []string{"pods/attach"}
	if _, err := cs.RbacV1().Roles(ns).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = sandbox.New(ctx, sandbox.WithDriver(limited), sandbox.WithImage(busyboxImage))
	if err == nil || !strings.Contains(err.Error(), "pods/exec") {
		t.Errorf("New without pods/exec: %v, want an error naming pods/exec", err)
	}
}
