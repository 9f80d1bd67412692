# SPDX-License-Identifier: MIT
# Stand-in for AITER's aiter/jit/core.py, reduced to what a builder needs: the
# `# config_env` block that defines the AITER_CONFIG_<X>_FILE names used by
# optCompilerConfig.json. qola reads this block statically (it parses the
# assignments between the two markers; it never imports or executes this file).
# Like AITER, each <X>_FILE can be redirected with the environment variable
# AITER_CONFIG_<X>.
import os

this_dir = os.path.dirname(os.path.abspath(__file__))
AITER_ROOT_DIR = os.path.abspath(f"{this_dir}/../../")


def get_config_file(env_name, default_file, tuned_file_name):
    """The tuned CSV to use: $<env_name> if set, else default_file.

    (AITER also merges several ':'-separated files and model_configs/; this
    example tree has a single file per op.)
    """
    config_env_file = os.getenv(env_name)
    return config_env_file if config_env_file else default_file


# config_env start here
AITER_CONFIG_RMSNORM = os.getenv(
    "AITER_CONFIG_RMSNORM",
    f"{AITER_ROOT_DIR}/aiter/configs/rmsnorm_tuned.csv",
)
AITER_CONFIG_SOFTMAX = os.getenv(
    "AITER_CONFIG_SOFTMAX",
    f"{AITER_ROOT_DIR}/aiter/configs/softmax_tuned.csv",
)
AITER_CONFIG_RMSNORM_FILE = get_config_file(
    "AITER_CONFIG_RMSNORM", AITER_CONFIG_RMSNORM, "rmsnorm_tuned"
)
AITER_CONFIG_SOFTMAX_FILE = get_config_file(
    "AITER_CONFIG_SOFTMAX", AITER_CONFIG_SOFTMAX, "softmax_tuned"
)
# config_env end here
