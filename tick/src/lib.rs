//! Sends one RunR schedule CloudEvent to a local server
