module agentlobby/example

go 1.19
