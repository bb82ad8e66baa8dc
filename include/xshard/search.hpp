#pragma once
/// \file
/// The strategy search (MindSpore's `recursive_programming` and `sharding_propagation`
/// modes): the cost model, machine calibration, and the search and propagation engines.

#include <xshard/search/calibrate.hpp>
#include <xshard/search/cost.hpp>
#include <xshard/search/evaluate_strategy.hpp>
#include <xshard/search/machine_model.hpp>
#include <xshard/search/network_spec.hpp>
#include <xshard/search/networks.hpp>
#include <xshard/search/op_options.hpp>
#include <xshard/search/operator_strategy.hpp>
#include <xshard/search/program_file.hpp>
#include <xshard/search/program_search.hpp>
#include <xshard/search/program_strategy_file.hpp>
#include <xshard/search/recursive_programming.hpp>
#include <xshard/search/redistribution_pricer.hpp>
#include <xshard/search/search_degrees.hpp>
#include <xshard/search/search_options.hpp>
#include <xshard/search/search_result.hpp>
#include <xshard/search/searched_strategy.hpp>
#include <xshard/search/sharding_propagation.hpp>
