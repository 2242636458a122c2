//! Property tests of the cores (filled in by the property-test work).
