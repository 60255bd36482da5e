//! Entrypoint of RunR function containers: HTTP, queue and schedule invocations of the user's program
