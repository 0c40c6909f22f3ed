// Package controlv1 is the generated Go code of tl.control.v1, the control
// plane between engines and the gateway: engines heartbeat their status and
// load to WorkerRegistry, and the gateway answers with drain and the route
// table's epoch.
package controlv1
