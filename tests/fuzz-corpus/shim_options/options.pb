
runtimeoptions.v1.Options/etc/turnstile/shim.json