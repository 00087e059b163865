// Package apidesc serves walship's API descriptors with their comments.
//
// protoc-gen-go drops source comments from the descriptors it embeds, so
// plain server reflection shows grpcurl users bare messages. walship.binpb is
// the API's FileDescriptorSet built by `buf build` (make generate) with
// source info kept; reflection resolves walship's files from it, so
// `grpcurl describe` shows every field's documentation.
package apidesc

import (
	_ "embed"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

//go:embed walship.binpb
var descriptorSet []byte

var (
	once  sync.Once
	files *protoregistry.Files
	err   error
)

// Files returns the API's file descriptors with source comments.
func Files() (*protoregistry.Files, error) {
	once.Do(func() {
		var set descriptorpb.FileDescriptorSet
		if err = proto.Unmarshal(descriptorSet, &set); err != nil {
			err = fmt.Errorf("apidesc: unmarshal descriptor set: %w", err)
			return
		}
		files, err = protodesc.NewFiles(&set)
		if err != nil {
			err = fmt.Errorf("apidesc: build descriptors: %w", err)
		}
	})
	return files, err
}

// Resolver finds files and descriptors first among walship's commented
// descriptors, then in the global registry (health, reflection, ...).
type Resolver struct{ own *protoregistry.Files }

// NewResolver returns a Resolver.
func NewResolver() (Resolver, error) {
	f, err := Files()
	return Resolver{own: f}, err
}

// FindFileByPath implements protodesc.Resolver.
func (r Resolver) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	if fd, err := r.own.FindFileByPath(path); err == nil {
		return fd, nil
	}
	return protoregistry.GlobalFiles.FindFileByPath(path)
}

// FindDescriptorByName implements protodesc.Resolver.
func (r Resolver) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	if d, err := r.own.FindDescriptorByName(name); err == nil {
		return d, nil
	}
	return protoregistry.GlobalFiles.FindDescriptorByName(name)
}
