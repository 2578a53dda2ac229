"""What the tests stand on: throwaway servers (`servers`), the machine's load and the scaling
of bounds by it (`load`), bounded waits (`waits`), child processes ended on every path
(`children`) and what the programs run as children share (`programs`), connection pools
(`pools`), recorded client commands (`recorded`) and the suite's hygiene plugin
(`hygiene`)."""
