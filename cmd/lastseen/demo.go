package main

import "errors"

// demoCmd: owned by the demo/ops helper.
type demoCmd struct{}

func (c *demoCmd) Run() error { return errors.New("demo: not yet written") }
