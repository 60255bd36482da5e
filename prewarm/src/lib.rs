//! Makes a pull-through cache registry fetch base images ahead of the first build
