// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3/etcdmain), built at the version that the
// Kubernetes release in go.mod is tested with, so the real control plane needs nothing from outside the Go
// module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
