// cdi_check injects CDI devices into an empty OCI spec with the CDI library
// containerd itself uses (tags.cncf.io/container-device-interface, the
// version containerd v2.4 requires), and prints what a container would get:
// {"errors": [...], "env": [...], "mounts": [...]}. The DRA tests run it on
// the specs kgpu-dra-plugin writes, so the CDI contract is checked by the
// runtime's own parser, not by kgpu's reading of the CDI documentation.
//
//	cdi_check SPEC_DIR DEVICE_ID...
package main

import (
	"encoding/json"
	"fmt"
	"os"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type result struct {
	Errors   []string    `json:"errors"`
	Unknown  []string    `json:"unknown"`
	Env      []string    `json:"env"`
	Mounts   []oci.Mount `json:"mounts"`
	Injected bool        `json:"injected"`
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: cdi_check SPEC_DIR DEVICE_ID...")
		os.Exit(2)
	}
	out := result{Errors: []string{}, Unknown: []string{}}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(os.Args[1]), cdi.WithAutoRefresh(false))
	if err != nil {
		out.Errors = append(out.Errors, err.Error())
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			out.Errors = append(out.Errors, path+": "+e.Error())
		}
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unknown, err := cache.InjectDevices(spec, os.Args[2:]...)
	if err != nil {
		out.Errors = append(out.Errors, err.Error())
	} else {
		out.Injected = true
	}
	out.Unknown = append(out.Unknown, unknown...)
	out.Env = spec.Process.Env
	out.Mounts = spec.Mounts
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		os.Exit(1)
	}
}
