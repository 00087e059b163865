// Package app is where walship's composition roots live: the packages
// that wire services together (app/cli, the subcommands; app/bench, the
// load generator; app/cluster, the in-process cluster of walship dev,
// walship bench and many tests). It holds no code of its own, only the import rule that
// keeps the module's layers pointing one way, checked by TestImportLayers.
//
// # Import rule
//
// Every package of the module is in one layer, and imports (outside
// _test.go files) only point down:
//
//	cmd/...                 mains: thin, may import anything below
//	app/...                 composition roots: services, and what they use
//	services/...            the services: leaves only, never another service
//	gen/, pkg/, internal/   leaves: libraries; leaves only
//
// So a leaf never imports a service or a root, and a service never
// imports a root: nothing a service imports can import a service back.
// Tests are exempt (a test is a root of its own: app/cluster's
// in-process cluster is used by the tests of leaves and services).
//
// Known exceptions, listed in layers_test.go and to be shrunk, not grown:
// services/node composes services/primary and services/replica (a node is
// a replica that becomes the primary).
package app
