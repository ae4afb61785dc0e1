"""`ragkit doctor`: will a model fit this machine (`fit`: GGUF headers, host memory, the
plan), and how fast will Kimi K2 run here (`simulate`: real-width slices measured through
the generator's own load path). The generator backends stay in `ragkit.generate`."""
