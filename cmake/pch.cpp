// The file the shared precompiled headers are built with (cmake/ScalelabPch.cmake): nothing of
// its own; CMake puts the headers in front of it.
