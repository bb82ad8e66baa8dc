#pragma once
/// \file
/// MindSpore's `AutoParallel` configuration object and the training driver around it
/// (`trainer`, callbacks).

#include <xshard/driver/auto_parallel.hpp>
#include <xshard/driver/callbacks.hpp>
#include <xshard/driver/gradient_path.hpp>
#include <xshard/driver/trainer.hpp>
