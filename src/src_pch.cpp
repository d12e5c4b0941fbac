// Owns the library's shared precompiled header (src/CMakeLists.txt).
