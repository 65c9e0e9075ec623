# Included by the recipes after they set WORK and VARS (their settings, as one line).
# make only sees whether a file exists, so a WORK folder built with other settings would silently mix
# outputs of different configurations: record the settings once and refuse a different set.
OLD_VARS := $(shell cat $(WORK)/recipe.vars 2>/dev/null)
ifneq ($(OLD_VARS),)
ifneq ($(OLD_VARS),$(VARS))
$(error $(WORK) was built with "$(OLD_VARS)"; pass the same variables, or use another WORK)
endif
endif
$(shell mkdir -p $(WORK) && echo '$(VARS)' > $(WORK)/recipe.vars)
