package main

import "errors"

// statusCmd, flushCmd, purgeCmd: owned by the demo/ops helper.
type statusCmd struct{}

func (c *statusCmd) Run() error { return errors.New("status: not yet written") }

type flushCmd struct{}

func (c *flushCmd) Run() error { return errors.New("flush: not yet written") }

type purgeCmd struct{}

func (c *purgeCmd) Run() error { return errors.New("purge: not yet written") }
