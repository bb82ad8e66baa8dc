#pragma once
/// \file
/// How xshard's code that depends on no template argument is compiled: in every translation
/// unit that includes it (the default, header-only), or once, in the library `xshard::compiled`.
///
/// Such code (the redistribution planner, the collectives' plumbing, the gradient buckets'
/// planning, the checkpoint files, the search) is declared in its header (a namespace-scope
/// function with `XSHARD_DECL`, a class's member as any member) and defined in the `.ipp`
/// file beside it, with `XSHARD_DECL`. A header-only program includes the `.ipp` files
/// through the headers and compiles those functions as `inline` ones, in each of its
/// translation units. A program that links `xshard::compiled` (CMake) is compiled with
/// `XSHARD_SEPARATE_COMPILATION` defined: the headers then declare those functions only, and
/// the library's one source file (`src/compiled.cpp`) defines them, so that the program's
/// compiler parses and optimises none of them. Both give the same program.

#include <cstdint>

#ifdef XSHARD_SEPARATE_COMPILATION
/// A function compiled once, in `xshard::compiled`.
#define XSHARD_DECL
#else
/// A function compiled in every translation unit that uses it.
#define XSHARD_DECL inline
#endif

/// The templates `xshard::compiled` holds for the common element types and tensor ranks are
/// named at the end of their headers with `XSHARD_INSTANTIATE`: an explicit instantiation
/// declaration in a program (its compiler instantiates none of them and links the library's),
/// an explicit instantiation definition in the library's source (`XSHARD_COMPILED_SOURCE`).
/// Other element types and ranks are instantiated in the program, as header-only.
#ifdef XSHARD_COMPILED_SOURCE
#define XSHARD_INSTANTIATE template
#else
#define XSHARD_INSTANTIATE extern template
#endif

/// X(T) for each element type `xshard::compiled` holds templates for.
#define XSHARD_COMPILED_ELEMENTS(X) X(float) X(double) X(std::int32_t) X(std::int64_t)
/// X(N) for each tensor rank `xshard::compiled` holds templates for.
#define XSHARD_COMPILED_RANKS(X) X(1) X(2) X(3) X(4)
/// X(T, N) for each element type and tensor rank `xshard::compiled` holds templates for.
#define XSHARD_COMPILED_ELEMENTS_AND_RANKS(X)                                                      \
    XSHARD_DETAIL_RANKS_OF(X, float)                                                               \
    XSHARD_DETAIL_RANKS_OF(X, double)                                                              \
    XSHARD_DETAIL_RANKS_OF(X, std::int32_t) XSHARD_DETAIL_RANKS_OF(X, std::int64_t)
#define XSHARD_DETAIL_RANKS_OF(X, T) X(T, 1) X(T, 2) X(T, 3) X(T, 4)
