"""Run a trained diffusion policy: ``Controller.load(RUN)``, then ``reset(seed)`` per episode and
``select_action(obs)`` per control step, as diffusion policy's and LeRobot's policies are
called. The public entry point; the controller is inference/controller.py (its control loop
tasks/policy/controller.py)."""

from diffscale.inference.controller import Controller

__all__ = ["Controller"]
