#pragma once
/// \file
/// xshard's version: `XSHARD_VERSION_MAJOR`, `_MINOR`, `_PATCH`, `XSHARD_VERSION` (one number,
/// 10000 * major + 100 * minor + patch, for `#if XSHARD_VERSION >= 100`) and
/// `XSHARD_VERSION_STRING` ("major.minor.patch"). CMakeLists.txt reads the project's version
/// from this file, so the package's version (`find_package(xshard 0.1)`) and the macros
/// cannot differ.

/// The major version: a change in it may break programs written against the previous one.
#define XSHARD_VERSION_MAJOR 0
/// The minor version: new features, nothing removed.
#define XSHARD_VERSION_MINOR 1
/// The patch version: fixes only.
#define XSHARD_VERSION_PATCH 0

/// The version as one number: 10000 * major + 100 * minor + patch.
#define XSHARD_VERSION                                                                             \
    (XSHARD_VERSION_MAJOR * 10000 + XSHARD_VERSION_MINOR * 100 + XSHARD_VERSION_PATCH)

#define XSHARD_DETAIL_STRINGIFY_IMPL(x) #x
#define XSHARD_DETAIL_STRINGIFY(x) XSHARD_DETAIL_STRINGIFY_IMPL(x)
/// The version as a string literal, "major.minor.patch".
#define XSHARD_VERSION_STRING                                                                      \
    XSHARD_DETAIL_STRINGIFY(XSHARD_VERSION_MAJOR)                                                  \
    "." XSHARD_DETAIL_STRINGIFY(XSHARD_VERSION_MINOR) "." XSHARD_DETAIL_STRINGIFY(                 \
        XSHARD_VERSION_PATCH)
