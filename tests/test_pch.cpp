// Owns the test programs' shared precompiled header (tests/CMakeLists.txt).
