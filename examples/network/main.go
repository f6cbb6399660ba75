// Command network shows a sandbox's network policy at work: the sandbox may
// reach one host and nothing else, calls that host's HTTPS API with a token
// it never sees (the library's egress proxy adds it on the way out and
// scrubs it from what comes back), and runs a web app that the host reaches
// through Expose.
//
//	go run ./network [-image REF]
//
// So that nothing outside this machine is contacted, the "API" is a local
// HTTPS server on the host's docker0 address (such as 172.17.0.1) with a
// certificate this program makes; the policy allows that one address. The
// image comes from -image, else SANDBOX_IMAGE, else the project's own
// Debian + Python image, which is built offline first if it is missing. It
// needs python3. It needs no root: the sandbox itself has no network, and
// its agent carries the proxy's and Expose's connections.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
)

// client is what the sandbox runs: a plain urllib call. urllib follows
// HTTPS_PROXY and trusts SSL_CERT_FILE, which the library sets; the code
// knows nothing about the token.
const client = `import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=20) as r:
    reply = json.load(r)
print("  status:", r.status)
print("  message:", reply["message"])
print("  the API says it got Authorization:", reply["you_sent"].get("Authorization"))
print("  X-Echo-Authorization header:", r.headers.get("X-Echo-Authorization"))
`

const page = `<!doctype html><title>sandbox app</title><h1>Hello from inside the sandbox</h1>
`

// waitListen polls until the web app accepts connections.
const waitListen = `import socket, time
for _ in range(400):
    try:
        socket.create_connection(("127.0.0.1", 8000), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
else:
    raise SystemExit("the web app did not start")
`

func main() {
	image := flag.String("image", "", "image to run (default: $SANDBOX_IMAGE or the project's Python image)")
	flag.Parse()
	log.SetFlags(0)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, *image)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// run does the work, so that deferred cleanup runs before the program exits.
func run(ctx context.Context, image string) error {
	ref := image
	if ref == "" {
		var err error
		if ref, err = images.FromEnv(ctx, os.Stderr); err != nil {
			return err
		}
	}

	// The API: an HTTPS server on the host's docker0 address.
	ip, err := bridgeAddr()
	if err != nil {
		return err
	}
	api, err := startAPI(ip)
	if err != nil {
		return err
	}
	defer api.Close()
	apiURL := "https://" + api.Addr
	fmt.Printf("API (on the host): %s\n", apiURL)

	var tok [12]byte
	rand.Read(tok[:])
	token := "Bearer tok-" + hex.EncodeToString(tok[:])

	sb, err := sandbox.New(ctx, sandbox.WithImage(ref),
		sandbox.WithNetwork(sandbox.NetworkPolicy{
			Allow:       []string{ip + "/32"}, // this one address, any port; nothing else
			Credentials: []sandbox.Credential{{Host: ip, Header: "Authorization", Value: token}},
		}))
	if err != nil {
		return err
	}
	defer sb.Close()
	fmt.Fprintf(os.Stderr, "sandbox %.12s is up (image %s)\n", sb.ID(), ref)

	// 1. The sandbox calls the API; the proxy adds the token.
	fmt.Println("\nthe sandbox calls the API:")
	if err := sb.WriteFile(ctx, "client.py", []byte(client), 0o644); err != nil {
		return err
	}
	cmd := sb.Command(ctx, "python3", "client.py", apiURL+"/v1/hello")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	fmt.Printf("\nthe API's view: it got Authorization %q\n", <-api.seen)
	r, err := sb.Exec(ctx, `env | grep -ci "tok-" ; python3 -c "import urllib.request as u; u.urlopen('https://example.invalid/', timeout=10)" 2>&1 | tail -n 1`)
	if err != nil {
		return err
	}
	lines := strings.SplitN(strings.TrimSpace(r.Stdout), "\n", 2)
	fmt.Printf("inside the sandbox: environment variables holding the token: %s\n", lines[0])
	if len(lines) > 1 {
		fmt.Printf("a host that is not allowed: %s\n", lines[1])
	}

	// 2. A web app in the sandbox, reached from the host.
	fmt.Println("\na web app in the sandbox:")
	if err := sb.MkdirAll(ctx, "site", 0o755); err != nil {
		return err
	}
	if err := sb.WriteFile(ctx, "site/index.html", []byte(page), 0o644); err != nil {
		return err
	}
	appCtx, stopApp := context.WithCancel(ctx)
	defer stopApp()
	app := sb.Command(appCtx, "python3", "-m", "http.server", "8000", "--directory", "site")
	if err := app.Start(); err != nil {
		return err
	}
	defer func() { stopApp(); app.Wait() }()
	if err := sb.Command(ctx, "python3", "-c", waitListen).Run(); err != nil {
		return err
	}
	u, err := sb.Expose(ctx, 8000)
	if err != nil {
		return err
	}
	resp, err := http.Get(u + "/")
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	fmt.Printf("GET %s/ from the host: %s\n%s", u, resp.Status, body)
	return nil
}

// bridgeAddr returns the host's address on docker0, where both the host
// and (through the proxy) the sandbox can reach a server.
func bridgeAddr() (string, error) {
	ifc, err := net.InterfaceByName("docker0")
	if err != nil {
		return "", fmt.Errorf("no docker0 interface to put the example API on: %w", err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.IP.String(), nil
		}
	}
	return "", errors.New("docker0 has no IPv4 address")
}

type apiServer struct {
	*http.Server
	seen chan string
	dir  string
}

func (s *apiServer) Close() error {
	defer os.RemoveAll(s.dir)
	return s.Server.Close()
}

// startAPI serves a small JSON API over HTTPS on ip. Its certificate comes
// from a CA made here, which this process then trusts (SSL_CERT_FILE is
// read by Go's TLS stack on first use), standing in for a public API whose
// certificate the host already trusts.
func startAPI(ip string) (*apiServer, error) {
	cert, caPEM, err := makeCert(ip)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "network-example")
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		return nil, err
	}
	os.Setenv("SSL_CERT_FILE", caFile)

	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &apiServer{seen: make(chan string, 16), dir: dir}
	s.Server = &http.Server{
		Addr:      l.Addr().String(),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case s.seen <- r.Header.Get("Authorization"):
			default:
			}
			// A careless API that echoes the request's headers back.
			sent := map[string]string{}
			var keys []string
			for k := range r.Header {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				sent[k] = r.Header.Get(k)
				w.Header().Set("X-Echo-"+k, r.Header.Get(k))
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"message": "hello from the API", "you_sent": sent})
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go s.ServeTLS(l, "", "")
	return s, nil
}

// makeCert returns a certificate for ip and the PEM of the CA that signed
// it.
func makeCert(ip string) (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "network example CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: ip},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP(ip)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}
