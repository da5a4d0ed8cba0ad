module elastra.dev/e2e/kind/runcwrap

go 1.26.0
