#pragma once
/// \file
/// The strategy search (MindSpore's `recursive_programming` and `sharding_propagation`
/// modes): the cost model, machine calibration, the search and propagation engines and
/// operator strategy files.

#include <xshard/auto/calibrate.hpp>
#include <xshard/auto/cost.hpp>
#include <xshard/auto/operator_strategy_file.hpp>
#include <xshard/auto/propagation.hpp>
#include <xshard/auto/search.hpp>
#include <xshard/auto/strategy_engine.hpp>
