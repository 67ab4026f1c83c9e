package main

import "errors"

// benchCmd: owned by the benchmark helper.
type benchCmd struct{}

func (c *benchCmd) Run() error { return errors.New("bench: not yet written") }
